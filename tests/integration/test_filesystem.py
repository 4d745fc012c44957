"""A real ext4 filesystem on a weir volume: nbdfuse exposes the export as a
file, a loop device turns that into a block device, and the kernel mounts it."""

import hashlib
import os
import subprocess
import tempfile
import time
import unittest

from weirtest import Weir, run

MIB = 1 << 20


def can_mount():
    return os.geteuid() == 0 and os.path.exists("/dev/fuse") and os.path.exists("/dev/loop-control")


@unittest.skipUnless(can_mount(), "needs root, /dev/fuse and loop devices")
class Ext4OnNbdfuse(unittest.TestCase):
    def test_mkfs_mount_write_read_unmount(self):
        with tempfile.TemporaryDirectory() as tmp, Weir("--export", "fs=mem:256M") as weir:
            fuse_dir = os.path.join(tmp, "fuse")
            mnt = os.path.join(tmp, "mnt")
            os.mkdir(fuse_dir)
            os.mkdir(mnt)
            # nbdfuse stays in the foreground serving FUSE; the file appears once mounted.
            fuse = subprocess.Popen(["nbdfuse", fuse_dir + "/disk", weir.uri("fs")],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            loop = None
            try:
                disk = os.path.join(fuse_dir, "disk")
                deadline = time.time() + 20
                while not os.path.exists(disk):
                    self.assertIsNone(fuse.poll(), "nbdfuse exited early")
                    self.assertLess(time.time(), deadline, "nbdfuse never mounted")
                    time.sleep(0.05)
                self.assertEqual(os.path.getsize(disk), 256 * MIB)
                loop = run("losetup", "--find", "--show", "--direct-io=off", disk).stdout.strip()
                run("mkfs.ext4", "-q", "-F", loop)
                run("mount", "-t", "ext4", loop, mnt)
                digests = {}
                for i in range(8):
                    data = os.urandom(3 * MIB + i * 4099)
                    with open(os.path.join(mnt, f"file{i}"), "wb") as f:
                        f.write(data)
                    digests[f"file{i}"] = hashlib.sha256(data).hexdigest()
                os.sync()
                run("umount", mnt)
                # Drop every cache between us and weir, then mount again and read back.
                run("losetup", "-d", loop)
                loop = run("losetup", "--find", "--show", "--direct-io=off", disk).stdout.strip()
                run("mount", "-t", "ext4", "-o", "ro", loop, mnt)
                for name, digest in digests.items():
                    with open(os.path.join(mnt, name), "rb") as f:
                        self.assertEqual(hashlib.sha256(f.read()).hexdigest(), digest, name)
                run("umount", mnt)
                run("fsck.ext4", "-n", "-f", loop)
            finally:
                subprocess.run(["umount", mnt], capture_output=True)
                if loop:
                    subprocess.run(["losetup", "-d", loop], capture_output=True)
                subprocess.run(["fusermount3", "-u", fuse_dir], capture_output=True)
                try:
                    fuse.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    fuse.kill()
            self.assertEqual(weir.stop(), 0)


if __name__ == "__main__":
    unittest.main()
