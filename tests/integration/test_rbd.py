"""RBD images in a real single-node Ceph cluster (scripts/ceph-cluster.sh),
served by weir to qemu-img, nbdcopy, fio and libnbd: as raw exports and as
pool members, with a second gateway on the same image, and with an OSD
stopped under load."""

import filecmp
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import unittest

import nbd

from weirtest import WEIR, Weir, run

MIB = 1 << 20
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../scripts/ceph-cluster.sh")
CLUSTER = {}
# 1 MiB of 0x5a with 256 KiB trimmed from its middle.
PARTLY_TRIMMED = b"\x5a" * (512 * 1024) + bytes(256 * 1024) + b"\x5a" * (256 * 1024)


# The cluster and the tests' images need well under this; a shared machine's
# disk can run short of it, and then the cluster runs in memory.
CLUSTER_ROOM_BYTES = 2 << 30


def cluster_parent_dir():
    """The temporary directory, or /dev/shm when its disk is short of room."""
    default = tempfile.gettempdir()
    if shutil.disk_usage(default).free >= CLUSTER_ROOM_BYTES:
        return default
    memory = "/dev/shm"
    if os.path.isdir(memory) and shutil.disk_usage(memory).free >= CLUSTER_ROOM_BYTES:
        print(f"test_rbd: {default} is short of room; the Ceph cluster runs under {memory}")
        return memory
    return default


def setUpModule():
    CLUSTER["dir"] = tempfile.mkdtemp(prefix="weir-ceph-", dir=cluster_parent_dir())
    CLUSTER["conf"] = os.path.join(CLUSTER["dir"], "ceph.conf")
    started = time.monotonic()
    try:
        run(SCRIPT, "start", CLUSTER["dir"], timeout=300)
    except BaseException:
        tearDownModule()
        raise
    CLUSTER["start_seconds"] = time.monotonic() - started


def tearDownModule():
    subprocess.run([SCRIPT, "stop", CLUSTER["dir"]], timeout=60, check=False)
    shutil.rmtree(CLUSTER["dir"], ignore_errors=True)


def rbd(*args, timeout=120):
    return run("rbd", "-c", CLUSTER["conf"], *args, timeout=timeout)


def new_image(name, size_mib):
    rbd("create", "--size", f"{size_mib}M", f"rbd/{name}")
    return f"rbd:rbd/{name},conf={CLUSTER['conf']}"


def random_file(path, size):
    with open(path, "wb") as f:
        for _ in range(size // MIB):
            f.write(os.urandom(MIB))
    return path


def fio(uri, *options, timeout=300):
    return run("fio", "--name=j", "--ioengine=nbd", f"--uri={uri}", "--output-format=normal",
               *options, timeout=timeout)


def serve_once(*args):
    """`weir serve` expected to fail at start: its exit code and stderr."""
    with tempfile.TemporaryDirectory() as tmp:
        result = run(WEIR, "serve", "--listen", "none", "--socket", os.path.join(tmp, "s.sock"),
                     "--data-dir", os.path.join(tmp, "data"), *args, check=False, timeout=90)
    return result.returncode, result.stderr


class ClusterScript(unittest.TestCase):
    def test_the_cluster_came_up_healthy_within_a_minute_or_so(self):
        self.assertLess(CLUSTER["start_seconds"], 120)
        status = run("ceph", "-c", CLUSTER["conf"], "osd", "pool", "get", "rbd", "size").stdout
        self.assertIn("size: 2", status)
        osds = run("ceph", "-c", CLUSTER["conf"], "osd", "stat").stdout
        self.assertIn("3 osds: 3 up", osds)


class RawExport(unittest.TestCase):
    def test_clients_write_and_read_an_image_and_the_bytes_land_in_ceph(self):
        spec = new_image("raw1", 256)
        with tempfile.TemporaryDirectory() as tmp:
            source = random_file(os.path.join(tmp, "source"), 32 * MIB)
            with Weir("--export", f"img={spec},readahead=on") as weir:
                uri = weir.uri("img")
                info = run("qemu-img", "info", "--output=json", uri).stdout
                self.assertIn('"virtual-size": 268435456', info)
                run("qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", source, uri)
                back = os.path.join(tmp, "back")
                run("nbdcopy", "--flush", uri, back)
                with open(back, "rb") as f:
                    self.assertEqual(f.read(32 * MIB), open(source, "rb").read())
                # fio writes and verifies a second region at queue depth 8.
                fio(uri, "--rw=randwrite", "--bs=4k", "--iodepth=8", "--offset=64M", "--size=16M",
                    "--verify=crc32c", "--do_verify=1", "--verify_state_save=0")

                handle = nbd.NBD()
                handle.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
                handle.connect_uri(uri)
                handle.pwrite(b"\x5a" * (8 * MIB), 128 * MIB)
                handle.flush()
                handle.trim(4 * MIB, 128 * MIB)  # a whole object
                handle.trim(256 * 1024, 133 * MIB + 512 * 1024)  # part of one
                handle.zero(MIB, 134 * MIB)
                self.assertEqual(handle.pread(4 * MIB, 128 * MIB), bytes(4 * MIB))
                self.assertEqual(handle.pread(MIB, 133 * MIB), PARTLY_TRIMMED)
                self.assertEqual(handle.pread(MIB, 134 * MIB), bytes(MIB))
                handle.flush()
                extents = []
                handle.block_status(8 * MIB, 128 * MIB,
                                    lambda _ctx, _off, entries, _err: extents.extend(entries))
                # The trimmed object is a hole; the one still holding data is not.
                self.assertEqual(extents[0], 4 * MIB)
                self.assertEqual(extents[1] & nbd.STATE_HOLE, nbd.STATE_HOLE, extents)
                handle.shutdown()
                self.assertEqual(weir.stop(), 0)
            exported = os.path.join(tmp, "exported")
            rbd("export", "rbd/raw1", exported)
            with open(exported, "rb") as f:
                self.assertEqual(f.read(32 * MIB), open(source, "rb").read())
                f.seek(128 * MIB)
                self.assertEqual(f.read(4 * MIB), bytes(4 * MIB))
                f.seek(133 * MIB)
                self.assertEqual(f.read(MIB), PARTLY_TRIMMED)
                self.assertEqual(f.read(MIB), bytes(MIB))

    def test_a_read_only_export_opens_an_image_another_gateway_writes(self):
        spec = new_image("shared", 64)
        with Weir("--export", f"img={spec}") as writer, \
                Weir("--export", f"img={spec},readonly") as reader:
            handle = nbd.NBD()
            handle.connect_uri(writer.uri("img"))
            handle.pwrite(b"\x42" * MIB, 0, nbd.CMD_FLAG_FUA)
            handle.shutdown()
            ro = nbd.NBD()
            ro.connect_uri(reader.uri("img"))
            self.assertTrue(ro.is_read_only())
            self.assertEqual(ro.pread(MIB, 0), b"\x42" * MIB)
            ro.shutdown()

    def test_a_missing_image_or_cluster_is_a_clear_error(self):
        code, stderr = serve_once("--export", f"img=rbd:rbd/nope,conf={CLUSTER['conf']}")
        self.assertNotEqual(code, 0)
        self.assertIn("opening image rbd/nope: No such file or directory", stderr)
        code, stderr = serve_once("--export", "img=rbd:rbd/x,conf=/nonexistent/ceph.conf")
        self.assertNotEqual(code, 0)
        self.assertIn("reading /nonexistent/ceph.conf", stderr)
        code, stderr = serve_once("--export", "img=rbd:nopool")
        self.assertNotEqual(code, 0)
        self.assertIn("want rbd:POOL/IMAGE", stderr)


class Gateways(unittest.TestCase):
    def test_a_second_gateway_is_refused_and_takes_over_once_the_first_dies(self):
        spec = new_image("gw", 64)
        first = Weir("--export", f"img={spec}").start()
        try:
            handle = nbd.NBD()
            handle.connect_uri(first.uri("img"))
            handle.pwrite(b"\x77" * MIB, 5 * MIB)
            handle.flush()
            code, stderr = serve_once("--export", f"img={spec}")
            self.assertNotEqual(code, 0)
            self.assertIn("held by another client", stderr)
            # Written but never flushed: a gateway that dies may lose it.
            handle.pwrite(b"\x88" * MIB, 9 * MIB)
            first.stop(signal.SIGKILL)
        finally:
            first.__exit__()
        # librbd breaks the dead gateway's lock once its watch expires.
        deadline = time.monotonic() + 90
        while True:
            try:
                with Weir("--export", f"img={spec}") as takeover:
                    ro = nbd.NBD()
                    ro.connect_uri(takeover.uri("img"))
                    self.assertEqual(ro.pread(MIB, 5 * MIB), b"\x77" * MIB)
                    ro.shutdown()
                    break
            except RuntimeError as err:
                self.assertIn("held by another client", str(err))
                self.assertLess(time.monotonic(), deadline, "the lock was never released")
                time.sleep(2)


    def test_an_image_without_the_exclusive_lock_is_served_with_a_warning(self):
        rbd("create", "--size", "64M", "--image-feature", "layering", "rbd/nolock")
        spec = f"rbd:rbd/nolock,conf={CLUSTER['conf']}"
        with Weir("--export", f"img={spec}") as weir:
            handle = nbd.NBD()
            handle.connect_uri(weir.uri("img"))
            handle.pwrite(b"\x33" * 4096, 0, nbd.CMD_FLAG_FUA)
            handle.shutdown()
            self.assertEqual(weir.stop(), 0)
            self.assertIn("the image has no exclusive-lock feature", weir.logs())

    def test_another_librbd_writer_is_refused_while_weir_serves(self):
        spec = new_image("busy", 64)
        with Weir("--export", f"img={spec}") as weir:
            result = run("rbd", "-c", CLUSTER["conf"], "bench", "--io-type", "write", "--io-size", "4K",
                         "--io-total", "64K", "rbd/busy", check=False, timeout=120)
            self.assertNotEqual(result.returncode, 0, result.stdout)
            self.assertTrue(weir.alive())


class PoolMembers(unittest.TestCase):
    def test_a_mirror_of_two_images_serves_a_volume_and_refuses_an_image_with_data(self):
        members = [new_image("m1", 1024), new_image("m2", 1024)]
        used = new_image("used", 256)
        with tempfile.TemporaryDirectory() as tmp:
            with Weir("--export", f"img={used}") as weir:
                handle = nbd.NBD()
                handle.connect_uri(weir.uri("img"))
                handle.pwrite(b"\x01" * 4096, 100 * MIB, nbd.CMD_FLAG_FUA)
                handle.shutdown()
            data_dir = os.path.join(tmp, "data")
            refused = run(WEIR, "pool", "create", "--data-dir", data_dir, "tank", "mirror",
                          members[0], used, check=False)
            self.assertNotEqual(refused.returncode, 0)
            self.assertIn(f"it holds data (at byte {100 * MIB})", refused.stderr)
            run(WEIR, "pool", "create", "--data-dir", data_dir, "tank", "mirror", *members)
            run(WEIR, "volume", "create", "--data-dir", data_dir, "tank/vol", "--size", "256M")
            source = random_file(os.path.join(tmp, "source"), 48 * MIB)
            with Weir("--data-dir", data_dir) as weir:
                uri = weir.uri("tank/vol")
                run("nbdcopy", "--flush", source, uri)
                status = run(WEIR, "pool", "status", "--data-dir", data_dir, "tank").stdout
                self.assertIn("ONLINE", status)
                self.assertEqual(weir.stop(), 0)
            with Weir("--data-dir", data_dir) as weir:
                back = os.path.join(tmp, "back")
                run("nbdcopy", weir.uri("tank/vol"), back)
                with open(back, "rb") as f:
                    self.assertEqual(f.read(48 * MIB), open(source, "rb").read())
                run(WEIR, "scrub", "start", "--data-dir", data_dir, "--wait", "tank", timeout=300)
                status = run(WEIR, "pool", "status", "--data-dir", data_dir, "tank").stdout
                self.assertIn("errors: none since the pool opened", status)


class OsdFailure(unittest.TestCase):
    def test_an_osd_stopped_under_load_costs_the_client_no_error(self):
        spec = new_image("load", 256)
        with Weir("--export", f"img={spec}") as weir:
            uri = weir.uri("img")
            outcome = {}

            def load():
                outcome["fio"] = run(
                    "fio", "--name=j", "--ioengine=nbd", f"--uri={uri}", "--rw=randrw", "--bs=4k",
                    "--iodepth=8", "--size=64M", "--time_based", "--runtime=30",
                    "--verify=crc32c", "--verify_backlog=256", "--verify_state_save=0", "--fsync=64",
                    check=False, timeout=180)

            thread = threading.Thread(target=load)
            thread.start()
            try:
                time.sleep(8)
                run(SCRIPT, "stop-osd", CLUSTER["dir"], "1")
                time.sleep(10)
            finally:
                run(SCRIPT, "start-osd", CLUSTER["dir"], "1")
                thread.join(timeout=200)
            result = outcome["fio"]
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            self.assertNotIn("verify", result.stderr.lower())
            self.assertEqual(weir.stop(), 0)
        # The OSD comes back and catches up.
        deadline = time.monotonic() + 120
        while "3 up" not in run("ceph", "-c", CLUSTER["conf"], "osd", "stat").stdout:
            self.assertLess(time.monotonic(), deadline)
            time.sleep(1)


if __name__ == "__main__":
    unittest.main()
