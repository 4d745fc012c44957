"""Large reads answered in pieces: with structured replies weir reads a
large request in pieces sized from its devices' measured costs and sends
each as a chunk as it lands. Whatever the pieces, every client reads back
exactly what was written, at any alignment, with structured replies on or
off, and the chunks cover each read exactly."""

import os
import unittest

import nbd

from test_pool import MIB, PoolTest
from weirtest import Weir


class ReadPieces(PoolTest):
    def serve(self, readahead="off", model=None):
        a, b = self.file("a.img", 256 * MIB), self.file("b.img", 256 * MIB)
        members = [f"model:{model},size=256M,store=file:{p}" for p in (a, b)] if model else [a, b]
        self.weir("create", "tank", "mirror", *members)
        self.volume("create", "tank/disk", "--size", "96M")
        # Readahead off unless asked: its windows would answer the reads.
        w = Weir("--data-dir", self.data, "--readahead", readahead).start()
        self.addCleanup(w.stop)
        return w

    def connect(self, w, structured):
        h = nbd.NBD()
        h.set_request_structured_replies(structured)
        h.connect_uri(w.uri("tank/disk"))
        self.addCleanup(h.shutdown)
        self.assertEqual(h.get_structured_replies_negotiated(), structured)
        return h

    def test_large_reads_read_back_exactly_with_and_without_structured_replies(self):
        w = self.serve()
        writer = self.connect(w, True)
        data = os.urandom(64 * MIB)
        for at in range(0, len(data), 8 * MIB):
            writer.pwrite(data[at:at + 8 * MIB], at)
        writer.flush()
        for structured in (True, False):
            h = self.connect(w, structured)
            for offset, length in [(0, 8 * MIB), (4096, 4 * MIB + 512), (MIB + 512, 2 * MIB),
                                   (17 * MIB, 16 * MIB), (60 * MIB, 4 * MIB), (3 * MIB, 65536)]:
                for _ in range(3):
                    self.assertEqual(h.pread(length, offset), data[offset:offset + length],
                                     f"structured={structured} read {length} at {offset}")

    def test_a_large_read_arrives_in_chunks_that_cover_it(self):
        # Disk models: a seek and a transfer rate the measured costs find
        # on any machine, where a plain file's costs are noise.
        w = self.serve(model="hdd")
        h = self.connect(w, True)
        data = os.urandom(16 * MIB)
        h.pwrite(data, 0)
        h.flush()
        # Reads of two lengths give the devices' cost per read and per
        # byte; until then a large read goes in halves.
        for _ in range(8):
            self.assertEqual(h.pread(16 * MIB, 0), data)
            self.assertEqual(h.pread(MIB, 0), data[:MIB])
        chunks = []

        def chunk(sub, offset, status, err):
            chunks.append((offset, bytes(sub)))
            return 0

        got = h.pread_structured(16 * MIB, 0, chunk)
        self.assertEqual(got, data)
        self.assertGreater(len(chunks), 1, "one large read, several chunks")
        at = 0
        for offset, sub in sorted(chunks):
            self.assertEqual(offset, at, "chunks neither overlap nor leave gaps")
            self.assertEqual(sub, data[offset:offset + len(sub)])
            at += len(sub)
        self.assertEqual(at, 16 * MIB)

    def test_a_stream_read_in_pieces_with_readahead_sees_every_overwrite(self):
        w = self.serve(readahead="on")
        h = self.connect(w, True)
        data = bytearray(os.urandom(64 * MIB))
        for at in range(0, len(data), 8 * MIB):
            h.pwrite(bytes(data[at:at + 8 * MIB]), at)
        h.flush()
        # Teach the devices' costs, then stream through the volume twice;
        # between reads a second connection overwrites what lies ahead,
        # which read-ahead may already hold.
        for _ in range(4):
            h.pread(8 * MIB, 0)
            h.pread(MIB, 0)
        other = self.connect(w, True)
        step = 4 * MIB
        for rewrite in range(2):
            for at in range(0, len(data), step):
                self.assertEqual(h.pread(step, at), bytes(data[at:at + step]),
                                 f"pass {rewrite}: read {step} at {at}")
                ahead = (at + step + 3 * 4096 * (rewrite + 1)) % len(data)
                patch = os.urandom(64 * 1024)
                if ahead + len(patch) <= len(data):
                    other.pwrite(patch, ahead)
                    data[ahead:ahead + len(patch)] = patch
        for at in range(0, len(data), 16 * MIB):
            self.assertEqual(h.pread(16 * MIB, at), bytes(data[at:at + 16 * MIB]))


if __name__ == "__main__":
    unittest.main()
