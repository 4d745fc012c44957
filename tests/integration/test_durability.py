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
import time
import unittest

import nbd

from test_pool import MIB, PoolTest
from test_protocol import RawClient
from weirtest import WEIR, Weir, raw_connection, run


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

    def test_the_other_member_alone_is_refused_after_a_run_without_the_first(self):
        a, b = self.make_pool()
        with self.serve() as w:
            h = self.connect(w)
            h.pwrite(b"\x11" * MIB, 0)
            h.flush()
            h.shutdown()
        os.rename(a, a + ".away")
        with self.serve() as w:
            h = self.connect(w)
            h.pwrite(b"\x22" * MIB, 0)
            h.flush()
            h.shutdown()
        # Only the member that missed those writes is left.
        os.rename(a + ".away", a)
        os.rename(b, b + ".away")
        refused = Weir("--data-dir", self.data)
        with self.assertRaises(RuntimeError):
            refused.start()
        self.assertIn("behind the", refused.logs())
        self.assertIn("a member holding newer writes is missing", refused.logs())
        refused.stop()
        # With both back, the current one serves and the other is rebuilt.
        os.rename(b + ".away", b)
        with self.serve() as w:
            h = self.connect(w)
            self.assertEqual(h.pread(MIB, 0), b"\x22" * MIB)
            h.shutdown()

    def test_a_pool_whose_devices_were_all_taken_by_another_pool_is_refused(self):
        a, b = self.make_pool()
        other = os.path.join(self.dir, "other")
        run(WEIR, "pool", "create", "other", "mirror", a, b, "--force", "--data-dir", other)
        status = self.weir("status", "tank").stdout
        self.assertIn("state: UNAVAIL", status)
        self.assertIn('its devices now belong to pool "other"', status)
        # With no other pool to serve, the server does not start.
        refused = Weir("--data-dir", self.data)
        with self.assertRaises(RuntimeError):
            refused.start()
        self.assertIn("nothing to serve", refused.logs())
        refused.stop()

    def test_a_member_whose_label_is_destroyed_is_unavailable_and_the_server_still_starts(self):
        a, _ = self.make_pool()
        data = os.urandom(MIB)
        with self.serve() as w:
            h = self.connect(w)
            h.pwrite(data, 0)
            h.flush()
            os.truncate(a, 0)  # behind the running server's back
            deadline = time.time() + 30
            while "its labels are gone" not in w.logs():
                self.assertLess(time.time(), deadline, "the running server never noticed")
                time.sleep(0.2)
            self.assertIn("member FAULTED", w.logs())
            self.assertEqual(h.pread(MIB, 0), data)
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
        self.pool_on_a_small_tmpfs()
        flushed = os.urandom(MIB)
        # Written through, each write meets the full disk itself (the
        # write-back cache's view of a full disk is in test_cache).
        w = Weir("--data-dir", self.data, "--cache", "writethrough").start()
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


class Region:
    """What one client may find in its region after a crash: the bytes a
    completed flush made durable, or those of any write sent after it."""

    def __init__(self, offset, length, initial):
        self.offset, self.length = offset, length
        self.durable = bytearray(initial)
        self.unflushed = []  # (offset within the region, bytes), sent since the last flush
        self.latest = bytearray(initial)

    def sent(self, at, data):
        self.unflushed.append((at, bytes(data)))
        self.latest[at:at + len(data)] = data

    def flushed(self, latest_at_send):
        self.durable = bytearray(latest_at_send)
        self.unflushed = []

    def legal(self, i, byte):
        if self.durable[i] == byte:
            return True
        return any(at <= i < at + len(data) and data[i - at] == byte for at, data in self.unflushed)

    def wrong_sectors(self, found, sector=512):
        """Offsets of the sectors of `found` holding a byte that is neither
        durable nor from a write sent since the last flush."""
        return [self.offset + at for at in range(0, self.length, sector)
                if found[at:at + sector] != self.durable[at:at + sector]
                and not all(self.legal(i, found[i]) for i in range(at, at + sector))]


class KillNine(PoolTest):
    """kill -9 under mixed load, many times: every flushed byte survives,
    every block reads, no byte holds data never written there."""

    ROUNDS = int(os.environ.get("WEIR_KILL_ROUNDS", "6"))
    CLIENTS = 3
    REGION = 4 * MIB

    def load(self, w, region, seed, stop, errors):
        rng = random.Random(seed)
        try:
            h = nbd.NBD()
            h.connect_uri(w.uri("tank/disk"))
            while not stop.is_set():
                kind = rng.random()
                if kind < 0.55:
                    length = rng.choice([512, 4096, 1000, 65536, 131072 + 7, 1 << 20])
                    at = rng.randrange(0, region.length - length)
                    data = rng.randbytes(length)
                    region.sent(at, data)
                    h.pwrite(data, region.offset + at, nbd.CMD_FLAG_FUA if rng.random() < 0.1 else 0)
                elif kind < 0.65:
                    length = rng.choice([4096, 65536, 12345])
                    at = rng.randrange(0, region.length - length)
                    region.sent(at, bytes(length))
                    h.zero(length, region.offset + at)
                elif kind < 0.8:
                    latest = bytes(region.latest)
                    h.flush()
                    region.flushed(latest)
                else:
                    length = rng.choice([4096, 65536])
                    at = rng.randrange(0, region.length - length)
                    got = h.pread(length, region.offset + at)
                    if got != bytes(region.latest[at:at + length]):
                        errors.append(f"read at {region.offset + at} returned other data than written")
        except nbd.Error:
            pass  # the server was killed under us

    def test_kill_9_under_mixed_load_loses_no_flushed_byte(self):
        a, b = self.file("a.img", 512 * MIB), self.file("b.img", 512 * MIB)
        self.weir("create", "tank", "mirror", a, b)
        self.volume("create", "tank/disk", "--size", "64M")
        regions = [Region(i * self.REGION, self.REGION, bytes(self.REGION)) for i in range(self.CLIENTS)]
        rng = random.Random(2024)
        for round_ in range(self.ROUNDS):
            w = Weir("--data-dir", self.data).start()
            stop, errors = threading.Event(), []
            threads = [threading.Thread(target=self.load, args=(w, r, rng.random(), stop, errors), daemon=True)
                       for r in regions]
            for t in threads:
                t.start()
            time.sleep(rng.uniform(0.3, 1.5))
            w.proc.send_signal(signal.SIGKILL)
            w.proc.wait()
            stop.set()
            for t in threads:
                t.join(timeout=30)
            w.stop()
            self.assertEqual(errors, [], f"round {round_}")
            with Weir("--data-dir", self.data) as w:  # every restart serves
                h = nbd.NBD()
                h.connect_uri(w.uri("tank/disk"))
                for region in regions:
                    found = h.pread(region.length, region.offset)  # EIO fails the test
                    wrong = region.wrong_sectors(found)
                    self.assertEqual(wrong[:5], [], f"round {round_}: {len(wrong)} sectors hold data never written there")
                    region.durable = bytearray(found)
                    region.latest = bytearray(found)
                    region.unflushed = []
                h.shutdown()
                self.assertEqual(w.stop(), 0)


class FlushRacingALongWrite(PoolTest):
    def test_a_long_unflushed_write_beside_a_flush_loop_leaves_every_block_readable_after_kill_9(self):
        a, b = self.file("a.img", 512 * MIB), self.file("b.img", 512 * MIB)
        self.weir("create", "tank", "mirror", a, b)
        self.volume("create", "tank/disk", "--size", "64M")
        length = 16 * MIB + 1024
        for round_ in range(3):
            baseline = os.urandom(length)
            w = Weir("--data-dir", self.data).start()
            h = nbd.NBD()
            h.connect_uri(w.uri("tank/disk"))
            h.pwrite(baseline, 512)
            h.flush()
            flusher = nbd.NBD()
            flusher.connect_uri(w.uri("tank/disk"))
            stop = threading.Event()

            def flush_loop():
                try:
                    while not stop.is_set():
                        flusher.flush()
                except nbd.Error:
                    pass

            t = threading.Thread(target=flush_loop, daemon=True)
            t.start()
            new = os.urandom(length)
            h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(new)), 512)
            time.sleep(1)
            w.proc.send_signal(signal.SIGKILL)
            w.proc.wait()
            stop.set()
            t.join(timeout=30)
            w.stop()
            with Weir("--data-dir", self.data) as w:
                h = nbd.NBD()
                h.connect_uri(w.uri("tank/disk"))
                found = h.pread(length, 512)  # no EIO anywhere
                for at in range(0, length, 512):
                    got = found[at:at + 512]
                    self.assertTrue(got == baseline[at:at + 512] or got == new[at:at + 512],
                                    f"round {round_}: sector at {512 + at} is neither old nor new")
                h.shutdown()
