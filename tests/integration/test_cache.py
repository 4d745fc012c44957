"""The write-back cache through the real weir binary and libnbd: writes
are seen at once by every connection, a FLUSH on any connection makes
every earlier write durable through kill -9, SIGTERM writes everything
back, memory stays within the dirty budget, and writethrough mode is
available per export."""

import os
import signal
import threading
import time
import unittest

import nbd

from test_pool import MIB, PoolTest
from weirtest import Weir, fetch_metrics, sparse_file


def thread_names(pid):
    names = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:
            pass  # ended while listed
    return names


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Cache(PoolTest):
    def make_pool(self, volume="256M"):
        a, b = self.file("a.img", 512 * MIB), self.file("b.img", 512 * MIB)
        self.weir("create", "tank", "mirror", a, b)
        self.volume("create", "tank/disk", "--size", volume)

    def connect(self, w, export="tank/disk"):
        h = nbd.NBD()
        h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
        h.connect_uri(w.uri(export))
        return h

    def kill_9(self, w):
        w.proc.send_signal(signal.SIGKILL)
        w.proc.wait()
        w.stop()

    def test_a_write_on_one_connection_is_read_at_once_on_another_and_a_flush_on_a_third_makes_it_durable(self):
        self.make_pool()
        w = Weir("--data-dir", self.data).start()
        writer, reader, flusher = self.connect(w), self.connect(w), self.connect(w)
        self.assertTrue(writer.can_multi_conn())
        data = os.urandom(3 * MIB + 4096)
        writer.pwrite(data, 5 * MIB + 512)  # unaligned at both ends
        self.assertEqual(reader.pread(len(data), 5 * MIB + 512), data)
        flusher.flush()
        self.kill_9(w)
        with Weir("--data-dir", self.data) as w:
            h = self.connect(w)
            self.assertEqual(h.pread(len(data), 5 * MIB + 512), data)
            h.shutdown()

    def test_fua_makes_its_own_write_durable_through_kill_9(self):
        self.make_pool()
        w = Weir("--data-dir", self.data).start()
        h = self.connect(w)
        data = os.urandom(MIB)
        h.pwrite(data, 7 * MIB, nbd.CMD_FLAG_FUA)
        self.kill_9(w)
        with Weir("--data-dir", self.data) as w:
            self.assertEqual(self.connect(w).pread(MIB, 7 * MIB), data)

    def test_sigterm_writes_back_every_cached_write_before_exit(self):
        self.make_pool()
        w = Weir("--data-dir", self.data).start()
        h = self.connect(w)
        data = os.urandom(8 * MIB)
        h.pwrite(data, 0)
        h.shutdown()
        self.assertEqual(w.stop(signal.SIGTERM), 0)
        with Weir("--data-dir", self.data) as w:
            self.assertEqual(self.connect(w).pread(len(data), 0), data)

    def test_zeroes_and_trims_are_exact_over_cached_writes_and_block_status_sees_cached_data(self):
        self.make_pool()
        with Weir("--data-dir", self.data) as w:
            h = self.connect(w)
            h.pwrite(b"\xaa" * (2 * MIB), 0)
            h.zero(MIB, 512 * 1024)
            got = h.pread(2 * MIB, 0)
            self.assertEqual(got, b"\xaa" * (512 * 1024) + bytes(MIB) + b"\xaa" * (512 * 1024))
            h.pwrite(b"\xbb" * 4096, 32 * MIB)
            extents = []
            h.block_status(64 * 1024, 32 * MIB,
                           lambda meta, offset, entries, err: extents.extend(entries) or 0)
            self.assertEqual(extents[1] & nbd.STATE_HOLE, 0, f"cached data reported as a hole: {extents}")

    def test_memory_stays_within_the_dirty_budget_while_a_client_writes_ten_times_it(self):
        self.make_pool(volume="384M")
        budget = 32 * MIB
        w = Weir("--data-dir", self.data, "--cache-dirty-max", "32M").start()
        try:
            h = self.connect(w)
            idle = rss_bytes(w.proc.pid)
            peak = [idle]
            done = threading.Event()

            def sample():
                while not done.is_set():
                    peak[0] = max(peak[0], rss_bytes(w.proc.pid))
                    time.sleep(0.01)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            block = os.urandom(MIB)
            for i in range(10 * budget // MIB):
                h.pwrite(block, i * MIB % (384 * MIB))
            h.flush()
            done.set()
            sampler.join()
            # The budget, plus the requests one connection may have in
            # flight and the pool's own buffers.
            allowed = idle + budget + 48 * MIB
            self.assertLess(peak[0], allowed, f"peak RSS {peak[0] >> 20} MiB, idle {idle >> 20} MiB")
            self.assertEqual(h.pread(MIB, 100 * MIB), block)
            # Every write was answered, so none waits for room any more.
            gauges = dict(line.split() for line in fetch_metrics(self.data).splitlines()
                          if line.startswith(("weir_cache_dirty_limit_bytes ", "weir_cache_waiting_writes ")))
            self.assertEqual(float(gauges["weir_cache_dirty_limit_bytes"]), budget)
            self.assertEqual(float(gauges["weir_cache_waiting_writes"]), 0)
        finally:
            w.stop()

    def test_replies_finished_on_other_threads_need_no_second_thread_per_connection(self):
        """Connections write past a small dirty budget and flush, so most
        replies finish on device threads or on other connections' threads.
        Each connection's own thread sends them: no reply thread runs, and
        going from one connection to eight adds the eight connection
        threads and at most two others (the kernel's io_uring workers
        aside)."""
        self.make_pool()
        w = Weir("--data-dir", self.data, "--cache-dirty-max", "4M").start()
        try:
            one = self.others_at_most(w, connections=1)
            eight = self.others_at_most(w, connections=8)
            self.assertEqual(one["reply"] + eight["reply"], 0, "a reply thread ran")
            self.assertLessEqual(len(eight["others"]), len(one["others"]) + 2,
                                 f"threads besides connections: {one['others']} with one, {eight['others']} with eight")
        finally:
            w.stop()

    def others_at_most(self, w, connections):
        """Run `connections` writers; the most threads seen at once that
        are not connection threads, and how often a reply thread was seen."""
        seen = {"others": [], "reply": 0}
        done = threading.Event()

        def sample():
            while not done.is_set():
                names = [n for n in thread_names(w.proc.pid) if not n.startswith("iou-wrk")]
                others = sorted(n for n in names if not n.startswith("weir-conn"))
                if len(others) > len(seen["others"]):
                    seen["others"] = others
                seen["reply"] += sum(n == "weir-reply" for n in names)
                time.sleep(0.01)

        errors = []

        def client(k):
            try:
                h = self.connect(w)
                block = bytes([k + 1]) * (64 * 1024)
                for round_ in range(20):
                    for i in range(16):
                        h.pwrite(block, (k * 32 + i) * MIB + round_ * 64 * 1024)
                    h.flush()
                self.assertEqual(h.pread(64 * 1024, k * 32 * MIB), block)
                h.shutdown()
            except Exception as err:  # noqa: BLE001 - reported below
                errors.append(err)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        clients = [threading.Thread(target=client, args=(k,)) for k in range(connections)]
        for c in clients:
            c.start()
        for c in clients:
            c.join(timeout=300)
        done.set()
        sampler.join()
        self.assertEqual(errors, [])
        return seen

    def test_writethrough_export_has_every_answered_write_on_the_device_through_kill_9(self):
        path = sparse_file(os.path.join(self.dir, "plain.img"), 64 * MIB)
        data = os.urandom(MIB)
        w = Weir("--export", f"plain={path},cache=writethrough").start()
        h = self.connect(w, "plain")
        h.pwrite(data, 3 * MIB)
        self.kill_9(w)
        with open(path, "rb") as f:
            f.seek(3 * MIB)
            self.assertEqual(f.read(MIB), data)

    @unittest.skipUnless(os.geteuid() == 0, "mounts a small tmpfs (root)")
    def test_a_write_back_that_meets_a_full_disk_fails_every_later_flush_and_loses_nothing_flushed(self):
        self.pool_on_a_small_tmpfs()
        flushed = os.urandom(MIB)
        w = Weir("--data-dir", self.data).start()
        try:
            h = self.connect(w)
            h.pwrite(flushed, 0)
            h.flush()
            cached = []
            for i in range(1, 100):
                data = os.urandom(MIB)
                try:
                    h.pwrite(data, i * MIB)  # answered from memory
                except nbd.Error as err:
                    # Background write-back met the full disk first: from
                    # then on every write fails, as a flush would.
                    self.assertEqual(err.errno, "EIO")
                    break
                cached.append(data)
            self.assertTrue(cached, "the first writes are answered from memory")
            with self.assertRaises(nbd.Error) as caught:
                h.flush()
            self.assertEqual(caught.exception.errno, "EIO")
            with self.assertRaises(nbd.Error):
                h.flush()  # latched
            with self.assertRaises(nbd.Error):
                h.pwrite(b"x" * 4096, 0, nbd.CMD_FLAG_FUA)
            with self.assertRaises(nbd.Error):
                h.pwrite(b"y" * 4096, 0)  # plain writes too
            # Nothing is dropped: every cached write still reads back.
            for i, data in enumerate(cached, start=1):
                self.assertEqual(h.pread(MIB, i * MIB), data)
            status = self.weir("status", "tank").stdout
            self.assertIn("volume disk: FAILED", status)
            self.assertNotIn("FAULTED", status)
        finally:
            self.kill_9(w)
        with Weir("--data-dir", self.data) as w:
            h = self.connect(w)
            self.assertEqual(h.pread(MIB, 0), flushed)
            for i in range(100):  # every block reads: old or new data, never EIO
                h.pread(MIB, i * MIB)
            h.shutdown()

    def test_a_bad_cache_mode_is_a_clear_error(self):
        path = sparse_file(os.path.join(self.dir, "plain.img"), MIB)
        w = Weir("--export", f"plain={path},cache=sometimes")
        with self.assertRaises(RuntimeError) as caught:
            w.start()
        self.assertIn("unknown cache mode", w.logs() + str(caught.exception))
        w.stop()


if __name__ == "__main__":
    unittest.main()
