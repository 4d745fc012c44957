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
    def serve(self):
        a, b = self.file("a.img", 256 * MIB), self.file("b.img", 256 * MIB)
        self.weir("create", "tank", "mirror", a, b)
        self.volume("create", "tank/disk", "--size", "96M")
        # Readahead off: its windows would answer the reads instead.
        w = Weir("--data-dir", self.data, "--readahead", "off").start()
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
        w = self.serve()
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

if __name__ == "__main__":
    unittest.main()
