"""Readahead through the real weir binary and libnbd: a sequential reader
spread over several connections is served from read-ahead (the pool's
devices see async-read I/O), and writes, TRIM and WRITE_ZEROES just ahead
of the reader are always read back, never the bytes read ahead before
them."""

import os
import re
import stat
import tempfile
import unittest

import nbd

from test_pool import MIB, PoolTest
from weirtest import Weir, fetch_metrics, sparse_file

REQUEST = 64 * 1024


def async_reads(metrics):
    return sum(int(float(v)) for v in re.findall(
        r'^weir_device_ops_total\{[^}]*class="async-read"\} (\S+)$', metrics, re.M))


class Readahead(PoolTest):
    def serve(self, *args):
        a, b = self.file("a.img", 256 * MIB), self.file("b.img", 256 * MIB)
        self.weir("create", "tank", "mirror", a, b)
        self.volume("create", "tank/disk", "--size", "64M")
        w = Weir("--data-dir", self.data, *args).start()
        self.addCleanup(w.stop)
        return w

    def connections(self, w, count):
        handles = []
        for _ in range(count):
            h = nbd.NBD()
            h.connect_uri(w.uri("tank/disk"))
            self.addCleanup(h.shutdown)
            handles.append(h)
        return handles

    def metrics(self):
        return fetch_metrics(self.data)

    def test_writes_ahead_of_a_reader_spread_over_connections_are_always_read_back(self):
        w = self.serve("--readahead", "on")
        readers = self.connections(w, 4)
        writer = self.connections(w, 1)[0]
        size = 64 * MIB
        expected = bytearray(os.urandom(size))
        for at in range(0, size, 4 * MIB):
            writer.pwrite(bytes(expected[at:at + 4 * MIB]), at)
        writer.flush()
        before = async_reads(self.metrics())
        change = 0
        for i in range(size // REQUEST):
            offset = i * REQUEST
            # Every fourth request, change a range a little ahead of the
            # reader (inside what it has read ahead), by turns with a
            # write, a TRIM and a WRITE_ZEROES.
            if i % 4 == 0 and offset + 3 * REQUEST + 8192 <= size:
                at = offset + 2 * REQUEST + 4096 * (i % 7)
                kind = change % 3
                change += 1
                if kind == 0:
                    data = os.urandom(8192)
                    writer.pwrite(data, at)
                    expected[at:at + 8192] = data
                elif kind == 1:
                    writer.trim(8192, at)
                    expected[at:at + 8192] = bytes(8192)
                else:
                    writer.zero(8192, at)
                    expected[at:at + 8192] = bytes(8192)
            got = readers[i % 4].pread(REQUEST, offset)
            self.assertEqual(got, bytes(expected[offset:offset + REQUEST]), f"read at {offset}")
        self.assertGreater(async_reads(self.metrics()) - before, 0, "the volume read ahead")

    def test_a_reader_spread_over_connections_is_answered_from_read_ahead(self):
        w = self.serve("--readahead", "on")
        readers = self.connections(w, 4)
        reads = 32 * MIB // REQUEST
        for i in range(reads):
            readers[i % 4].pread(REQUEST, i * REQUEST)
        metrics = self.metrics()
        hits = re.search(r'^weir_volume_readahead_hits_total\{volume="tank/disk"\} (\d+)$', metrics, re.M)
        self.assertIsNotNone(hits, "readahead counters in /metrics")
        self.assertGreater(int(hits.group(1)), reads * 9 // 10, "nearly every read answered from read-ahead")

    def test_a_client_with_reads_in_flight_reads_back_every_write_ahead_of_it(self):
        # Eight 4 KiB reads in flight at a time, in order: such a stream is
        # read ahead whenever a trial measures that faster. Writes a little
        # ahead of it from another connection are always read back.
        w = self.serve("--readahead", "on")
        reader, writer = self.connections(w, 2)
        size, length, depth = 16 * MIB, 4096, 8
        expected = bytearray(os.urandom(size))
        for at in range(0, size, 4 * MIB):
            writer.pwrite(bytes(expected[at:at + 4 * MIB]), at)
        writer.flush()
        in_flight = {}
        offset, sent = 0, 0
        while offset < size or in_flight:
            while offset < size and len(in_flight) < depth:
                if sent % 64 == 0 and offset + 40 * length <= size:
                    at = offset + 32 * length
                    data = os.urandom(8192)
                    writer.pwrite(data, at)
                    expected[at:at + 8192] = data
                buf = nbd.Buffer(length)
                in_flight[reader.aio_pread(buf, offset)] = (offset, buf)
                offset += length
                sent += 1
            reader.poll(-1)
            for cookie in [c for c in in_flight if reader.aio_command_completed(c)]:
                at, buf = in_flight.pop(cookie)
                self.assertEqual(bytes(buf.to_bytearray()), bytes(expected[at:at + length]), f"read at {at}")

    def test_a_cache_hint_reads_the_range_ahead(self):
        w = self.serve()
        h = self.connections(w, 1)[0]
        data = os.urandom(8 * MIB)
        h.pwrite(data, 0)
        h.flush()

        def hits():
            found = re.search(r'^weir_volume_readahead_hits_total\{volume="tank/disk"\} (\d+)$',
                              self.metrics(), re.M)
            return int(found.group(1))

        before_async, before_hits = async_reads(self.metrics()), hits()
        h.cache(MIB, 4 * MIB)
        # Random reads inside the hinted range, none a stream: each is
        # answered from the prefetch, or waits for it.
        offsets = [4 * MIB + k * REQUEST for k in (9, 2, 13, 0, 6)]
        for offset in offsets:
            self.assertEqual(h.pread(REQUEST, offset), data[offset:offset + REQUEST])
        self.assertGreater(async_reads(self.metrics()) - before_async, 0, "the hint was read ahead")
        self.assertEqual(hits() - before_hits, len(offsets), "every read found it")
        # A write inside the range after the hint is read back, not the prefetch.
        patch = os.urandom(8192)
        h.pwrite(patch, 4 * MIB + 3 * REQUEST)
        self.assertEqual(h.pread(REQUEST, 4 * MIB + 3 * REQUEST), patch + data[4 * MIB + 3 * REQUEST + 8192:4 * MIB + 4 * REQUEST])

    def read_a_written_stream(self, w):
        """Write 16 MiB, then read it back in order at QD1: reads of
        unwritten data would need no device at all."""
        reader = self.connections(w, 1)[0]
        data = os.urandom(256 * REQUEST)
        reader.pwrite(data, 0)
        reader.flush()
        for i in range(256):
            self.assertEqual(reader.pread(REQUEST, i * REQUEST), data[i * REQUEST:(i + 1) * REQUEST])
        return self.metrics()

    def test_by_default_a_stream_is_read_ahead(self):
        metrics = self.read_a_written_stream(self.serve())
        self.assertGreater(async_reads(metrics), 0)

    def test_with_readahead_off_the_devices_see_no_async_reads(self):
        metrics = self.read_a_written_stream(self.serve("--readahead", "off"))
        self.assertEqual(async_reads(metrics), 0)
        self.assertNotIn("weir_volume_readahead_hits", metrics)


class RawExports(unittest.TestCase):
    """A server of --export devices alone, with no pools: its exports'
    read-ahead and cache figures are read from its admin endpoint."""

    def test_an_export_only_server_serves_metrics_and_a_second_one_in_its_directory_still_serves(self):
        work = tempfile.TemporaryDirectory(prefix="weir-raw-")
        self.addCleanup(work.cleanup)
        data = os.path.join(work.name, "weir-data")
        disk, other = os.path.join(work.name, "disk.img"), os.path.join(work.name, "other.img")
        sparse_file(disk, 64 * MIB)
        sparse_file(other, 16 * MIB)
        first = Weir("--export", f"disk=file:{disk}", workdir=work.name).start()
        self.addCleanup(first.stop)
        h = nbd.NBD()
        h.connect_uri(first.uri("disk"))
        payload = os.urandom(8 * MIB)
        h.pwrite(payload, 0)
        h.flush()
        for offset in range(0, 8 * MIB, REQUEST):
            self.assertEqual(h.pread(REQUEST, offset), payload[offset:offset + REQUEST])
        h.shutdown()
        metrics = fetch_metrics(data)
        hits = re.search(r'^weir_volume_readahead_hits_total\{volume="disk"\} (\S+)$', metrics, re.M)
        self.assertIsNotNone(hits, metrics[-2000:])
        self.assertGreater(float(hits.group(1)), 0, "a stream read in order is read ahead")
        self.assertIn('weir_volume_cache_dirty_bytes{volume="disk"}', metrics)
        self.assertEqual(stat.S_IMODE(os.stat(data).st_mode), 0o700)
        # A second such server from the same directory cannot hold it: it
        # says so and serves its exports all the same.
        second = Weir("--export", f"other=file:{other}", workdir=work.name).start()
        self.addCleanup(second.stop)
        h = nbd.NBD()
        h.connect_uri(second.uri("other"))
        h.pwrite(b"x" * 4096, 0)
        self.assertEqual(h.pread(4096, 0), b"x" * 4096)
        h.shutdown()
        self.assertIn("no admin endpoint", second.logs())
        self.assertIn("another weir serve holds it", second.logs())
        self.assertNotIn('volume="other"', fetch_metrics(data))


if __name__ == "__main__":
    unittest.main()
