"""Real clients against the real weir binary: qemu-img, qemu-io, nbdinfo, nbdcopy."""

import filecmp
import tempfile
import os
import unittest

from weirtest import Weir, run, sparse_file

MIB = 1 << 20


def random_image(path, size):
    with open(path, "wb") as f:
        for _ in range(size // MIB):
            f.write(os.urandom(MIB))
    return path


class QemuImg(unittest.TestCase):
    def test_convert_into_an_export_and_back_is_identical(self):
        with tempfile.TemporaryDirectory() as tmp:
            source = random_image(os.path.join(tmp, "source.img"), 256 * MIB)
            backing = sparse_file(os.path.join(tmp, "volume.img"), 256 * MIB)
            with Weir("--export", f"vol={backing}") as weir:
                uri = weir.uri("vol")
                run("qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", source, uri)
                back = os.path.join(tmp, "back.img")
                run("qemu-img", "convert", "-f", "raw", "-O", "raw", uri, back)
                run("qemu-img", "compare", "-f", "raw", "-F", "raw", source, back)
                self.assertTrue(filecmp.cmp(source, back, shallow=False))
                info = run("qemu-img", "info", "--output=json", uri).stdout
                self.assertIn('"virtual-size": 268435456', info)
                self.assertEqual(weir.stop(), 0)


class QemuIo(unittest.TestCase):
    def test_patterns_unaligned_zero_discard_flush(self):
        with tempfile.TemporaryDirectory() as tmp:
            backing = sparse_file(os.path.join(tmp, "volume.img"), 64 * MIB)
            with Weir("--export", f"vol={backing}") as weir:
                commands = [
                    "write -P 0x11 0 1M",
                    "write -P 0x22 513 4095",  # unaligned offset and length
                    "write -P 0x33 1000001 7",  # tiny, inside one block
                    "write -P 0x44 4095 2",  # straddles two blocks
                    "write -z 2M 1M",
                    "discard 4M 1M",
                    "write -P 0x55 -f 8M 64k",  # FUA
                    "flush",
                    "read -P 0x11 0 513",
                    "read -P 0x22 513 3582",
                    "read -P 0x44 4095 2",
                    "read -P 0x22 4097 511",
                    "read -P 0x11 4608 995393",
                    "read -P 0x33 1000001 7",
                    "read -P 0x11 1000008 48568",
                    "read -P 0 2M 1M",
                    "read -P 0 4M 1M",
                    "read -P 0x55 8M 64k",
                ]
                args = ["qemu-io", "-f", "raw", weir.uri("vol")]
                for command in commands:
                    args += ["-c", command]
                out = run(*args)
                text = out.stdout + out.stderr
                self.assertNotIn("failed", text.lower(), text)
                self.assertEqual(text.count("read "), 10, text)
                self.assertEqual(weir.stop(), 0)
            # The bytes really are on the backing file, not just in flight.
            with open(backing, "rb") as f:
                data = f.read(9 * MIB)
            self.assertEqual(data[512:513], b"\x11")
            self.assertEqual(data[513:4095], b"\x22" * 3582)
            self.assertEqual(data[4095:4097], b"\x44\x44")
            self.assertEqual(data[2 * MIB:3 * MIB], bytes(MIB))
            self.assertEqual(data[8 * MIB:8 * MIB + 65536], b"\x55" * 65536)


class NbdInfo(unittest.TestCase):
    def test_list_shows_every_export(self):
        with Weir("--export", "alpha=mem:16M", "--export", "beta=mem:32M,readonly",
                  "--export", "gamma=mem:1G") as weir:
            out = run("nbdinfo", "--list", weir.uri("")).stdout
            for name in ("alpha", "beta", "gamma"):
                self.assertIn(f'export="{name}"', out)
            beta = run("nbdinfo", "--json", weir.uri("beta")).stdout
            self.assertIn('"is_read_only": true', beta)
            self.assertIn('"export-size": 33554432', beta)
            self.assertIn('"block_size_maximum": 33554432', beta)

    def test_map_shows_holes_after_trim_and_write_zeroes(self):
        with Weir("--export", "vol=mem:16M") as weir:
            uri = weir.uri("vol")
            run("qemu-io", "-f", "raw", uri, "-c", "write -P 0x7 0 8M")
            run("qemu-io", "-f", "raw", uri, "-c", "discard 1M 1M", "-c", "write -z -u 4M 2M")
            lines = [l.split() for l in run("nbdinfo", "--map", uri).stdout.splitlines()]
            extents = [(int(l[0]), int(l[1]), int(l[2])) for l in lines]
            self.assertIn((1 * MIB, 1 * MIB, 3), extents, lines)
            self.assertIn((4 * MIB, 2 * MIB, 3), extents, lines)
            self.assertIn((0, 1 * MIB, 0), extents, lines)
            self.assertIn((8 * MIB, 8 * MIB, 3), extents, lines)

    def test_tcp_listener_works(self):
        with Weir("--export", "vol=mem:16M", tcp=True) as weir:
            out = run("nbdinfo", weir.tcp_uri("vol")).stdout
            self.assertIn("export-size: 16777216", out)


class NbdCopy(unittest.TestCase):
    def test_copy_in_and_out_is_byte_identical(self):
        with tempfile.TemporaryDirectory() as tmp:
            source = random_image(os.path.join(tmp, "source.img"), 256 * MIB)
            with Weir("--export", "vol=mem:256M") as weir:
                run("nbdcopy", source, weir.uri("vol"))
                back = os.path.join(tmp, "back.img")
                run("nbdcopy", weir.uri("vol"), back)
                self.assertTrue(filecmp.cmp(source, back, shallow=False))
                self.assertEqual(weir.stop(), 0)


if __name__ == "__main__":
    unittest.main()
