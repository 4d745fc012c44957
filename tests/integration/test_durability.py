"""Pools never lose flushed data: members that go away and come back,
labels destroyed under a running server, writes cut short by kill -9,
full file systems and clients that stop reading. The real weir binary,
driven by libnbd."""

import os
import random
import signal
import socket
import struct
import threading
import subprocess
import tempfile
import time
import unittest

import nbd

from test_pool import MIB, PoolTest
from test_protocol import RawClient
from weirtest import Weir, raw_connection


class Durability(RawClient, PoolTest):
    def serve(self):
        return Weir("--data-dir", self.data)

    def make_pool(self, size=512 * MIB, volume="256M"):
        a, b = self.file("a.img", size), self.file("b.img", size)
        self.weir("create", "tank", "mirror", a, b)
        self.volume("create", "tank/disk", "--size", volume)
        return a, b

    def connect(self, w):
        h = nbd.NBD()
        h.connect_uri(w.uri("tank/disk"))
        return h

    def test_a_member_away_for_one_run_returns_stale_and_is_rebuilt_from_the_current_copy(self):
        a, b = self.make_pool()
        old, new = b"\x11" * MIB, b"\x22" * MIB
        with self.serve() as w:
            h = self.connect(w)
            h.pwrite(old, 0)
            h.flush()
            h.shutdown()
        os.rename(a, a + ".away")
        with self.serve() as w:
            h = self.connect(w)
            h.pwrite(new, 0)
            h.flush()
            h.shutdown()
        os.rename(a + ".away", a)
        with self.serve() as w:
            self.assertIn("returned behind the pool's generation", w.logs())
            h = self.connect(w)
            self.assertEqual(h.pread(MIB, 0), new)
            # The resilver runs in the background; reads stay right during it.
            deadline = time.time() + 60
            while "RESILVERING" in self.weir("status", "tank").stdout:
                self.assertEqual(h.pread(MIB, 0), new)
                self.assertLess(time.time(), deadline, "the resilver never ended")
                time.sleep(0.2)
            h.shutdown()
        self.assertIn("state: ONLINE", self.weir("status", "tank").stdout)
        with self.serve() as w:
            h = self.connect(w)
            self.assertEqual(h.pread(MIB, 0), new)
            h.shutdown()
        with open(a, "rb") as fa, open(b, "rb") as fb:
            fa.seek(4 * MIB)
            fb.seek(4 * MIB)
            self.assertEqual(fa.read(64 * MIB), fb.read(64 * MIB), "the copies agree")

    def test_a_member_whose_label_is_destroyed_is_unavailable_and_the_server_still_starts(self):
        a, _ = self.make_pool()
        data = os.urandom(MIB)
        with self.serve() as w:
            h = self.connect(w)
            h.pwrite(data, 0)
            h.flush()
            os.truncate(a, 0)  # behind the running server's back
            h.shutdown()
        with self.serve() as w:
            h = self.connect(w)
            self.assertEqual(h.pread(MIB, 0), data)
            h.shutdown()
        status = self.weir("status", "tank").stdout
        self.assertIn("state: DEGRADED", status)
        self.assertIn(f"not a member: {a}: no weir label", status)
        self.assertRegex(status, rf"{a}\s+UNAVAIL")

    @unittest.skipUnless(os.geteuid() == 0, "mounts a small tmpfs (root)")
    def test_a_full_file_system_is_enospc_to_the_client_and_never_a_fault(self):
        full = tempfile.mkdtemp(prefix="weir-full-")
        self.addCleanup(os.rmdir, full)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160M", "tmpfs", full], check=True)
        self.addCleanup(subprocess.run, ["umount", "-l", full])
        a, b = os.path.join(full, "a.img"), os.path.join(full, "b.img")
        for path in (a, b):
            with open(path, "wb") as f:
                f.truncate(128 * MIB)  # two sparse 128 MiB files on 160 MiB
        self.weir("create", "tank", "mirror", a, b)
        self.volume("create", "tank/disk", "--size", "100M")
        flushed = os.urandom(MIB)
        w = self.serve().start()
        try:
            h = self.connect(w)
            h.pwrite(flushed, 0)
            h.flush()
            failures = []
            for i in range(1, 100):
                try:
                    h.pwrite(os.urandom(MIB), i * MIB)
                except nbd.Error as err:
                    failures.append(err.errno)
            self.assertTrue(failures, "the file system never filled")
            self.assertEqual(set(failures), {"ENOSPC"})
            h.flush()  # the data already allocated is made durable
            for i in range(100):  # every block reads: old or new data, never EIO
                h.pread(MIB, i * MIB)
            self.assertNotIn("FAULTED", w.logs())
        finally:
            w.proc.send_signal(signal.SIGKILL)
            w.proc.wait()
            w.stop()
        with self.serve() as w:  # starts on the full file system
            h = self.connect(w)
            self.assertEqual(h.pread(MIB, 0), flushed)
            for i in range(100):
                h.pread(MIB, i * MIB)
            h.shutdown()
        status = self.weir("status", "tank").stdout
        self.assertIn("state: ONLINE", status)

    def test_a_client_that_never_reads_its_replies_holds_up_no_other_client(self):
        self.make_pool()
        with self.serve() as w:
            h = self.connect(w)
            h.pwrite(os.urandom(4 * MIB), 0)
            h.flush()
            stalled = raw_connection(w.socket)
            self.handshake_to_options(stalled)
            self.go(stalled, b"tank/disk")
            # Thousands of small reads of the chunks the others write, and
            # not one reply read: the socket's buffers fill.
            stalled.settimeout(5)
            sent = 0
            try:
                for i in range(20000):
                    at = (i % 1024) * 4096
                    stalled.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 0, i, at, 4096))
                    sent += 1
            except (socket.timeout, BlockingIOError):
                pass  # weir stopped reading requests: its budget is full
            self.assertGreater(sent, 1000)
            started = time.monotonic()
            done = []

            def writer(k):
                other = self.connect(w)
                for j in range(8):
                    other.pwrite(os.urandom(64 * 1024), (k * 8 + j) * 64 * 1024)
                    other.flush()
                other.shutdown()
                done.append(k)

            threads = [threading.Thread(target=writer, args=(k,), daemon=True) for k in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=30)
            took = time.monotonic() - started
            self.assertEqual(sorted(done), [0, 1, 2, 3], "writers beside the stalled client hung")
            self.assertLess(took, 20)
            stalled.close()
            h.shutdown()
