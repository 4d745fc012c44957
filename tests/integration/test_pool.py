"""weir pool create / status: labels on real files, and the bad input
around them (another pool's device, a device listed twice or too small, a
damaged label copy, a missing member)."""

import concurrent.futures
import json
import os
import re
import subprocess
import signal
import socket
import tempfile
import threading
import time
import unittest

import nbd

import modelcheck
from weirtest import WEIR, Weir, admin_call, fetch_metrics, run

MIB = 1 << 20


class PoolTest(unittest.TestCase):
    """Helpers: files in a temporary directory, weir pool/volume on them."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="weir-pool-")
        self.dir = self.tmp.name
        self.data = os.path.join(self.dir, "data")

    def tearDown(self):
        self.tmp.cleanup()

    def file(self, name, size=256 * MIB):
        path = os.path.join(self.dir, name)
        with open(path, "wb") as f:
            f.truncate(size)
        return path

    def pool_on_a_small_tmpfs(self):
        """A mirror pool of two sparse 128 MiB files on a 160 MiB tmpfs,
        with a 100 MiB volume tank/disk: writes fill the file system."""
        full = tempfile.mkdtemp(prefix="weir-full-")
        self.addCleanup(os.rmdir, full)
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160M", "tmpfs", full],
                                 capture_output=True, text=True)
        if mounted.returncode != 0:
            self.skipTest(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
        self.addCleanup(subprocess.run, ["umount", "-l", full])
        a, b = os.path.join(full, "a.img"), os.path.join(full, "b.img")
        for path in (a, b):
            with open(path, "wb") as f:
                f.truncate(128 * MIB)
        self.weir("create", "tank", "mirror", a, b)
        self.volume("create", "tank/disk", "--size", "100M")

    def weir(self, *args, check=True):
        return run(WEIR, "pool", *args, "--data-dir", self.data, check=check, timeout=60)

    def volume(self, *args, check=True):
        return run(WEIR, "volume", *args, "--data-dir", self.data, check=check, timeout=60)

    def admin_addr(self):
        with open(os.path.join(self.data, "admin.addr")) as f:
            return f.read().strip()

    def status_row(self, status, device):
        """The counters of one member in `weir pool status`: READ WRITE CKSUM REPAIRED READS."""
        for line in status.splitlines():
            words = line.split()
            if words and words[0] == device:
                return words[1], [int(w) for w in words[-5:]]
        self.fail(f"{device} not in status:\n{status}")


class Pools(PoolTest):
    def test_a_mirror_is_created_and_reported_online(self):
        a, b = self.file("a.img"), self.file("b.img")
        out = self.weir("create", "tank", "mirror", a, b).stdout
        self.assertIn("pool: tank", out)
        self.assertIn("mirror-0", out)
        self.assertEqual(out.count("ONLINE"), 5, out)  # state, pool, mirror, two devices
        with open(a, "rb") as f:
            self.assertEqual(f.read(8), b"WEIRLBL1")
            f.seek(256 * MIB - 4096)
            self.assertEqual(f.read(8), b"WEIRLBL1", "the second label copy sits at the end")
        self.assertIn("state: ONLINE", self.weir("status", "tank").stdout)

    def test_bad_layouts_and_devices_are_refused_with_the_reason(self):
        a, b, c = self.file("a.img"), self.file("b.img"), self.file("c.img")
        small = self.file("small.img", size=MIB)
        used = self.file("used.img")
        with open(used, "r+b") as f:
            f.write(b"\x7fELF")
        self.weir("create", "tank", "mirror", a, b)
        cases = [
            (("create", "other", used), "is in use: it holds data (at byte 0)"),
            (("create", "other", c, a), "belongs to pool \"tank\""),
            (("create", "other", "mirror", c, c), "listed twice"),
            (("create", "other", small), "too small"),
            (("create", "other", "mirror", c), "at least two devices"),
            (("create", "other", c, "mirror", a, b), "mirror"),
            (("create", "tank", c), "already exists"),
            (("create", "bad/name", c), "invalid pool name"),
            (("create", "other", "mem:1G"), "keep their data"),
            (("status", "nosuch"), "no pool named"),
        ]
        for args, reason in cases:
            result = self.weir(*args, check=False)
            self.assertNotEqual(result.returncode, 0, args)
            self.assertIn(reason, result.stderr, args)
        # --force takes a device from another pool.
        out = self.weir("create", "other", c, a, "--force").stdout
        self.assertIn("pool: other", out)

    def test_a_damaged_label_copy_is_rewritten_from_the_other(self):
        a, b = self.file("a.img"), self.file("b.img")
        self.weir("create", "tank", "mirror", a, b)
        with open(a, "r+b") as f:
            f.seek(100)
            f.write(b"\xff" * 16)  # inside label A: the checksum no longer matches
        out = self.weir("status", "tank").stdout
        self.assertIn("state: ONLINE", out)
        self.assertIn(f"rewrote a stale or damaged label copy on {a}", out)
        self.assertNotIn("rewrote", self.weir("status", "tank").stdout, "repaired once")

    def test_a_missing_member_leaves_the_mirror_degraded(self):
        a, b = self.file("a.img"), self.file("b.img")
        self.weir("create", "tank", "mirror", a, b)
        os.rename(b, b + ".gone")
        out = self.weir("status", "tank").stdout
        self.assertIn("state: DEGRADED", out)
        self.assertRegex(out, rf"{b}\s+UNAVAIL")
        os.rename(a, a + ".gone")
        out = self.weir("status", "tank").stdout
        self.assertIn("state: UNAVAIL", out)
        self.assertIn("none of its devices could be opened", out)


    def test_a_pool_that_cannot_open_is_unavail_and_the_others_are_served(self):
        a, b, c, d = (self.file(n) for n in ("a.img", "b.img", "c.img", "d.img"))
        self.weir("create", "tank", "mirror", a, b)
        self.weir("create", "broken", "mirror", c, d)
        self.volume("create", "tank/disk", "--size", "16M")
        self.volume("create", "broken/v", "--size", "16M")
        for path in (c, d):
            os.rename(path, path + ".gone")
        listed = self.volume("list")
        self.assertIn("tank/disk", listed.stdout)
        self.assertIn("pool UNAVAIL, its volumes not listed", listed.stderr)
        pools = self.weir("list").stdout.splitlines()
        self.assertEqual([(l.split()[0], l.split()[-1]) for l in pools[1:]],
                         [("broken", "UNAVAIL"), ("tank", "ONLINE")])
        self.assertRegex(pools[2], r"tank\s+25\d\.\d MiB\s+16\.0 MiB\s+2\d\d\.\d MiB\s+6%\s+ONLINE")
        with Weir("--data-dir", self.data) as w:
            h = nbd.NBD()
            h.connect_uri(w.uri("tank/disk"))
            h.pwrite(b"\x5a" * 4096, 0)
            h.flush()
            self.assertEqual(h.pread(4096, 0), b"\x5a" * 4096)
            h.shutdown()
            missing = nbd.NBD()
            with self.assertRaises(nbd.Error):
                missing.connect_uri(w.uri("broken/v"))
            status = self.weir("status").stdout
            self.assertRegex(status, r"pool: broken\n state: UNAVAIL\nstatus: the pool cannot be opened: .*"
                                     r"none of its devices could be opened")
            self.assertRegex(status, r"pool: tank\n.*\n state: ONLINE")
            metrics = fetch_metrics(self.data)
            self.assertIn('weir_pool_state{pool="broken",state="UNAVAIL"} 1', metrics)
            self.assertIn('weir_pool_state{pool="tank",state="ONLINE"} 1', metrics)
            # The Prometheus text format passes Prometheus's own linter ...
            checked = subprocess.run(["promtool", "check", "metrics"], input=metrics, capture_output=True,
                                     text=True, timeout=60)
            self.assertEqual(checked.returncode, 0, checked.stdout + checked.stderr)
            self.assertIn("# TYPE weir_member_reads_total counter", metrics)
            # ... and a scraper that asks for OpenMetrics gets it.
            status, body = admin_call(self.data, "GET", "/metrics",
                                      headers={"Accept": "application/openmetrics-text;version=1.0.0"})
            self.assertEqual(status, 200)
            self.assertIn("# TYPE weir_member_reads counter", body)
            self.assertTrue(body.endswith("# EOF\n"), body[-40:])
            self.assertEqual(self.weir("list").stdout.splitlines()[1:], pools[1:], "the server lists as offline")
            refused = run(WEIR, "scrub", "start", "broken", "--data-dir", self.data, check=False)
            self.assertNotEqual(refused.returncode, 0)
            self.assertIn("pool broken is UNAVAIL", refused.stderr)
            self.assertEqual(w.stop(), 0)


class Volumes(PoolTest):
    def test_volumes_reserve_space_and_free_it(self):
        a, b = self.file("a.img"), self.file("b.img")
        self.weir("create", "tank", "mirror", a, b)
        self.volume("create", "tank/db", "--size", "100M")
        self.volume("create", "tank/vm", "--size", "64M", "--block-size", "16K")
        listing = self.volume("list").stdout
        self.assertRegex(listing, r"tank/db\s+104857600\s+4096")
        self.assertRegex(listing, r"tank/vm\s+67108864\s+16384")
        full = self.volume("create", "tank/big", "--size", "200M", check=False)
        self.assertNotEqual(full.returncode, 0)
        self.assertIn("no room", full.stderr)
        self.volume("delete", "tank/db")
        self.volume("create", "tank/big", "--size", "100M")  # fits only in the freed space
        listing = self.volume("list", "tank").stdout
        self.assertNotIn("tank/db", listing)
        self.assertIn("tank/big", listing)
        for args, reason in [
            (("create", "tank/vm", "--size", "1M"), "already exists"),
            (("create", "tank/x", "--size", "4095"), "multiple of the block size"),
            (("create", "tank/x", "--size", "1M", "--block-size", "3K"), "power of two"),
            (("create", "nosuch/x", "--size", "1M"), "no pool named"),
            (("delete", "tank/nothing"), "no volume"),
        ]:
            result = self.volume(*args, check=False)
            self.assertNotEqual(result.returncode, 0, args)
            self.assertIn(reason, result.stderr, args)

    def test_the_table_survives_a_damaged_copy_and_reaches_a_member_that_was_away(self):
        a, b = self.file("a.img"), self.file("b.img")
        self.weir("create", "tank", "mirror", a, b)
        self.volume("create", "tank/db", "--size", "10M")

        def damage_a():
            with open(a, "r+b") as f:
                f.seek(4096 + 40)  # inside a's copy of the volume table
                f.write(b"\x00\xff" * 8)

        def serve_until_rebuilt():
            with Weir("--data-dir", self.data) as w:
                deadline = time.time() + 60
                while "RESILVERING" in self.weir("status", "tank").stdout:
                    self.assertLess(time.time(), deadline, "the returning member is never rebuilt")
                    time.sleep(0.2)
                self.assertEqual(w.stop(), 0)

        damage_a()
        self.assertIn("tank/db", self.volume("list").stdout)
        # Opened with both members, the pool rewrites a's copy from b's.
        serve_until_rebuilt()
        # A DEGRADED pool takes volume changes; b misses this one, and gets
        # the table when it is back.
        os.rename(b, b + ".gone")
        self.volume("create", "tank/more", "--size", "1M")
        os.rename(b + ".gone", b)
        serve_until_rebuilt()
        os.rename(a, a + ".gone")
        listed = self.volume("list").stdout
        self.assertIn("tank/db", listed)
        self.assertIn("tank/more", listed)
        # With the only copy in service damaged, the table is not known:
        # changes are refused rather than written over it.
        os.rename(a + ".gone", a)
        damage_a()
        os.rename(b, b + ".gone")
        refused = self.volume("create", "tank/third", "--size", "1M", check=False)
        self.assertNotEqual(refused.returncode, 0)
        self.assertIn("volume table is damaged on every member in service", refused.stderr)
        os.rename(b + ".gone", b)
        serve_until_rebuilt()
        listed = self.volume("list").stdout
        self.assertIn("tank/db", listed)
        self.assertIn("tank/more", listed)


class Serving(PoolTest):
    """Pool volumes served over NBD: mirrored, checksummed, healing."""

    def serve(self):
        return Weir("--data-dir", self.data)

    def make_pool(self):
        a, b = self.file("a.img", 512 * MIB), self.file("b.img", 512 * MIB)
        self.weir("create", "tank", "mirror", a, b)
        self.volume("create", "tank/disk", "--size", "256M")
        return a, b

    def test_a_corrupted_copy_is_read_around_and_healed(self):
        a, _ = self.make_pool()
        src = os.path.join(self.dir, "src.img")
        with open(src, "wb") as f:
            f.write(os.urandom(32 * MIB))
        with self.serve() as w:
            uri = w.uri("tank/disk")
            run("qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", src, uri)
            # Scribble over 8 MiB of one copy's data region, under the server.
            with open(a, "r+b") as f:
                f.seek(8 * MIB)
                f.write(os.urandom(8 * MIB))
            run("qemu-img", "compare", "-f", "raw", "-F", "raw", src, uri)
            # The reads healed the bad blocks they met on a (the read policy
            # decides how many reads went to a); a scrub heals the rest.
            by_reads = w.logs().count("repaired a bad block")
            self.assertEqual(self.status_row(self.weir("status", "tank").stdout, a)[1][3], by_reads)
            out = run(WEIR, "scrub", "start", "tank", "--wait", "--data-dir", self.data, timeout=120).stdout
            by_scrub = int(out.split(" repaired")[0].rsplit(" ", 1)[1])
            self.assertEqual(by_reads + by_scrub, 2048, "each bad 4 KiB block of a, once")
            repaired = w.logs().count("repaired a bad block")
            run("qemu-img", "compare", "-f", "raw", "-F", "raw", src, uri)
            self.assertEqual(w.logs().count("repaired a bad block"), repaired, "healed for good")
            self.assertEqual(w.stop(), 0)
        with self.serve() as w:  # checksums were persisted by the shutdown flush
            run("qemu-img", "compare", "-f", "raw", "-F", "raw", src, w.uri("tank/disk"))

    def test_both_copies_bad_gives_eio_never_wrong_data(self):
        a, b = self.make_pool()
        with self.serve() as w:
            h = nbd.NBD()
            h.connect_uri(w.uri("tank/disk"))
            h.pwrite(b"\x11" * MIB, 0)
            h.flush()
            for path in (a, b):
                with open(path, "r+b") as f:
                    f.seek(2 * MIB + 4096)  # the second block of the data region
                    f.write(b"\xee" * 16)
            with self.assertRaises(nbd.Error) as err:
                h.pread(8192, 0)
            self.assertEqual(err.exception.errno, "EIO")
            self.assertEqual(h.pread(4096, 0), b"\x11" * 4096, "the good block next to it still reads")
            h.shutdown()

    def test_random_unaligned_concurrent_io_matches_a_model(self):
        """Random reads, writes, zeroes and trims on three connections,
        unaligned and up to 16 in flight, crowded so that requests in
        flight together share blocks
        (each block's checksum covers bytes from several of them). The
        volume matches the model, after a restart too, and a scrub of the
        pool finds nothing to repair."""
        self.make_pool()
        model = modelcheck.Model(256 * MIB, 4 * MIB)
        with self.serve() as w:
            handles = []
            for _ in range(3):  # blocks shared across connections too
                handles.append(nbd.NBD())
                handles[-1].connect_uri(w.uri("tank/disk"))
            counts = modelcheck.run_random_io(handles, model, ops=3000, seed=11)
            self.assertGreater(counts.get("read", 0), 500, counts)
            self.assertGreater(counts.get("write", 0), 500, counts)
            self.assertGreater(counts.get("block shared with a write in flight", 0), 100, counts)
            handles[0].flush()
            modelcheck.check_whole(handles[1], model, "tank/disk")
            for h in handles:
                h.shutdown()
            self.assertEqual(w.stop(), 0)
        with self.serve() as w:
            h = nbd.NBD()
            h.connect_uri(w.uri("tank/disk"))
            modelcheck.check_whole(h, model, "tank/disk after a restart")
            h.shutdown()
            self.assertEqual(w.stop(), 0)
            self.assertNotIn("checksum", w.logs().lower())

    def test_flushed_writes_survive_kill_9_and_copies_agree(self):
        a, b = self.make_pool()
        flushed = {}
        with self.serve() as w:
            h = nbd.NBD()
            h.connect_uri(w.uri("tank/disk"))
            for i in range(64):
                data = os.urandom(64 * 1024)
                h.pwrite(data, i * 3 * MIB)
                flushed[i * 3 * MIB] = data
            h.flush()
            for i in range(64):  # unflushed: may or may not survive
                h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(os.urandom(64 * 1024))), i * 3 * MIB + MIB)
            w.proc.send_signal(signal.SIGKILL)
            w.proc.wait()
        with self.serve() as w:
            self.assertIn("recovering dirty regions", w.logs())
            h = nbd.NBD()
            h.connect_uri(w.uri("tank/disk"))
            for offset, data in flushed.items():
                self.assertEqual(h.pread(len(data), offset), data, f"flushed data at {offset}")
            for i in range(64):  # every block reads: no spurious checksum errors
                h.pread(64 * 1024, i * 3 * MIB + MIB)
            h.shutdown()
            self.assertEqual(w.stop(), 0)
        # Everything between the two labels (which name their own device)
        # is the same on both copies.
        with open(a, "rb") as fa, open(b, "rb") as fb:
            fa.seek(4096)
            fb.seek(4096)
            left = 512 * MIB - 8192
            while left > 0:
                take = min(left, MIB)
                at = fa.tell()
                self.assertEqual(fa.read(take), fb.read(take), f"copies differ in [{at}, {at + take})")
                left -= take


class Import(PoolTest):
    def test_a_pool_is_imported_from_its_devices_into_another_data_dir(self):
        a, b, c, d = (self.file(n) for n in ("a.img", "b.img", "c.img", "d.img"))
        self.weir("create", "tank", "mirror", a, b, "mirror", c, d)
        self.volume("create", "tank/disk", "--size", "64M")
        elsewhere = os.path.join(self.dir, "elsewhere")
        out = run(WEIR, "pool", "import", a, b, c, d, "--data-dir", elsewhere).stdout
        self.assertIn("state: ONLINE", out)
        self.assertIn("tank/disk", run(WEIR, "volume", "list", "--data-dir", elsewhere).stdout)
        again = run(WEIR, "pool", "import", a, b, c, d, "--data-dir", elsewhere, check=False)
        self.assertNotEqual(again.returncode, 0)
        self.assertIn("already registered", again.stderr)
        # One copy of each mirror is enough to import (DEGRADED) ...
        third = os.path.join(self.dir, "third")
        out = run(WEIR, "pool", "import", a, d, "--data-dir", third).stdout
        self.assertIn("state: DEGRADED", out)
        # ... but a mirror with no member given is refused.
        fourth = os.path.join(self.dir, "fourth")
        none = run(WEIR, "pool", "import", a, b, "--data-dir", fourth, check=False)
        self.assertNotEqual(none.returncode, 0)
        self.assertIn("no current member", none.stderr)
        # Devices of two pools do not add up to one.
        e, f = self.file("e.img"), self.file("f.img")
        self.weir("create", "other", "mirror", e, f)
        mixed = run(WEIR, "pool", "import", a, b, c, e, "--data-dir", fourth, check=False)
        self.assertNotEqual(mixed.returncode, 0)
        self.assertIn("belongs to pool", mixed.stderr)


    def test_export_forgets_a_pool_and_destroy_frees_its_devices(self):
        a, b = self.file("a.img"), self.file("b.img")
        self.weir("create", "tank", "mirror", a, b)
        self.volume("create", "tank/disk", "--size", "16M")
        # A server with no admin endpoint cannot take the change: refused.
        with Weir("--data-dir", self.data, "--admin", "none") as w:
            for verb in ("export", "destroy"):
                refused = self.weir(verb, "tank", check=False)
                self.assertNotEqual(refused.returncode, 0, verb)
                self.assertIn("its admin endpoint is not known", refused.stderr)
            self.assertEqual(w.stop(), 0)
        self.assertIn(f"import it with weir pool import {a} {b}", self.weir("export", "tank").stdout)
        self.assertEqual(self.weir("list").stdout.splitlines()[1:], [])
        self.assertIn("state: ONLINE", self.weir("import", a, b).stdout)
        self.assertIn("tank/disk", self.volume("list").stdout, "the devices kept the pool")
        out = self.weir("destroy", "tank").stdout
        self.assertIn(f"{a}: labels erased", out)
        self.assertIn("pool tank destroyed", out)
        gone = self.weir("import", a, b, check=False)
        self.assertNotEqual(gone.returncode, 0)
        self.assertIn("no weir label", gone.stderr)
        # The data is not wiped: a new pool takes the devices with --force.
        self.assertIn("holds data", self.weir("create", "new", "mirror", a, b, check=False).stderr)
        self.weir("create", "new", "mirror", a, b, "--force")

    def test_import_with_no_devices_lists_what_it_finds_and_imports_by_name(self):
        devices = os.path.join(self.dir, "devices")
        os.mkdir(devices)
        a, b, c = (self.file(os.path.join("devices", n)) for n in ("a.img", "b.img", "c.img"))
        self.weir("create", "tank", "mirror", a, b)
        self.weir("create", "solo", c)
        self.volume("create", "tank/disk", "--size", "8M")
        self.weir("export", "tank")
        listed = self.weir("import", "--dir", devices).stdout
        self.assertIn("pool: tank", listed)
        self.assertIn("state: ONLINE", listed)
        self.assertIn(f"action: weir pool import tank --dir {devices}", listed)
        self.assertNotIn("solo", listed, "a registered pool is not offered")
        # Through a running server, by name.
        with Weir("--data-dir", self.data) as w:
            imported = self.weir("import", "tank", "--dir", devices).stdout
            self.assertIn("state: ONLINE", imported)
            self.assertIn("tank/disk", self.volume("list").stdout)
            missing = self.weir("import", "nosuch", "--dir", devices, check=False)
            self.assertNotEqual(missing.returncode, 0)
            self.assertIn('no pool named "nosuch"', missing.stderr)
            self.assertEqual(w.stop(), 0)
        self.assertIn("no pools to import", self.weir("import", "--dir", devices).stdout)

    def test_a_served_member_is_refused_by_a_second_server_import_and_create(self):
        a, b, c = (self.file(n) for n in ("a.img", "b.img", "c.img"))
        self.weir("create", "tank", "mirror", a, b)
        self.volume("create", "tank/disk", "--size", "16M")
        elsewhere = os.path.join(self.dir, "elsewhere")
        with Weir("--data-dir", self.data) as w:
            server_pid = str(w.proc.pid)
            attempts = {
                "import": [WEIR, "pool", "import", a, b, "--data-dir", elsewhere],
                "create": [WEIR, "pool", "create", "other", "mirror", a, c, "--force", "--data-dir", elsewhere],
                "serve": [WEIR, "serve", "--listen", "none", "--socket", os.path.join(self.dir, "second.sock"),
                          "--admin", "none", "--data-dir", elsewhere, "--export", f"x={b}"],
            }
            for what, cmd in attempts.items():
                refused = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
                self.assertNotEqual(refused.returncode, 0, what)
                self.assertIn("is in use by process " + server_pid, refused.stderr, what)
            # The pool served on is whole and still answers.
            self.assertIn("state: ONLINE", self.weir("status", "tank").stdout)
            self.assertEqual(w.stop(), 0)
        # Once the server is gone the devices are free again.
        out = run(WEIR, "pool", "import", a, b, "--data-dir", elsewhere).stdout
        self.assertIn("state: ONLINE", out)


    def loop_devices(self, path, count):
        """`count` loop devices over one file: one disk reached by several
        paths, as through multipath or from two hosts on a SAN."""
        devices = []
        for _ in range(count):
            made = subprocess.run(["losetup", "--find", "--show", path], capture_output=True, text=True)
            if made.returncode != 0:
                self.skipTest(f"no loop devices here: {made.stderr.strip()}")
            devices.append(made.stdout.strip())
            self.addCleanup(subprocess.run, ["losetup", "--detach", devices[-1]])
        return devices

    def as_another_host(self, *args):
        """Run weir in a mount and UTS namespace whose machine id and host
        name are another machine's."""
        fake = os.path.join(self.dir, "other-machine-id")
        with open(fake, "w") as f:
            f.write("0123456789abcdef0123456789abcdef\n")
        script = ('for f in /etc/machine-id /var/lib/dbus/machine-id; do '
                  '[ -e "$f" ] && mount --bind "$0" "$f"; done; hostname other-host; exec "$@"')
        return subprocess.run(["unshare", "--mount", "--uts", "sh", "-c", script, fake, WEIR, *args],
                              capture_output=True, text=True, timeout=120)

    def test_a_member_reached_by_another_path_or_host_is_refused_while_its_holder_beats(self):
        a, b = self.file("a.img"), self.file("b.img")
        a1, a2 = self.loop_devices(a, 2)
        b1, b2 = self.loop_devices(b, 2)
        self.weir("create", "tank", "mirror", a1, b1)
        self.volume("create", "tank/disk", "--size", "16M")
        elsewhere = os.path.join(self.dir, "elsewhere")
        with Weir("--data-dir", self.data) as w:
            server_pid = w.proc.pid
            h = nbd.NBD()
            h.connect_uri(w.uri("tank/disk"))
            h.pwrite(b"\xab" * 65536, 0)
            h.flush()
            h.shutdown()
            # Another path on this host: flock cannot see it, the stamp can.
            same_host = run(WEIR, "pool", "import", a2, b2, "--data-dir", elsewhere, check=False)
            self.assertNotEqual(same_host.returncode, 0)
            self.assertIn(f"is held by weir process {server_pid} on host", same_host.stderr)
            # Another host: refused, and --force watches the heartbeat go on.
            other = self.as_another_host("pool", "import", a2, b2, "--data-dir", elsewhere)
            self.assertNotEqual(other.returncode, 0)
            self.assertIn(f"is held by weir process {server_pid}", other.stderr)
            forced = self.as_another_host("pool", "import", a2, b2, "--force", "--data-dir", elsewhere)
            self.assertNotEqual(forced.returncode, 0, forced.stdout)
            self.assertIn("its heartbeat went on while we watched", forced.stderr)
            self.assertIn("state: ONLINE", self.weir("status", "tank").stdout)
            w.proc.kill()
            w.proc.wait()
        # The holder is gone. This host knows it at once (its pid is gone);
        # another host needs --force and sees the heartbeat stand still.
        third = os.path.join(self.dir, "third")
        other = self.as_another_host("pool", "import", a2, b2, "--data-dir", third)
        self.assertNotEqual(other.returncode, 0)
        self.assertIn("--force takes the pool once the heartbeat is seen to stop", other.stderr)
        forced = self.as_another_host("pool", "import", a2, b2, "--force", "--data-dir", third)
        self.assertEqual(forced.returncode, 0, forced.stderr)
        self.assertIn("state: ONLINE", forced.stdout)
        self.assertIn(f"taking over from weir process {server_pid}", forced.stderr)
        out = run(WEIR, "pool", "import", a2, b2, "--data-dir", elsewhere).stdout
        self.assertIn("state: ONLINE", out)
        # The flushed write is there through the other paths.
        with Weir("--data-dir", elsewhere) as w2:
            h = nbd.NBD()
            h.connect_uri(w2.uri("tank/disk"))
            self.assertEqual(h.pread(65536, 0), b"\xab" * 65536)
            h.shutdown()


class Replace(PoolTest):
    def test_a_vanished_member_is_faulted_writes_go_on_and_a_replacement_is_resilvered(self):
        a, b, c = (self.file(n, 512 * MIB) for n in ("a.img", "b.img", "c.img"))
        ctl_b = os.path.join(self.dir, "b.faults")
        open(ctl_b, "w").close()
        spec_a = f"model:ssd,size=512M,store=file:{a}"
        spec_b = f"model:ssd,size=512M,store=file:{b},control={ctl_b}"
        self.weir("create", "tank", "mirror", spec_a, spec_b)
        self.volume("create", "tank/disk", "--size", "256M")
        with Weir("--data-dir", self.data) as w:
            uri = w.uri("tank/disk")
            run("qemu-io", "-f", "raw", "-c", "write -P 0x11 0 64M", "-c", "flush", uri)
            with open(ctl_b, "w") as f:
                f.write("vanish\n")
            deadline = time.time() + 10
            while os.path.getsize(ctl_b) and time.time() < deadline:
                time.sleep(0.05)
            # The pool keeps taking writes with one copy gone.
            run("qemu-io", "-f", "raw", "-c", "write -P 0x22 32M 64M", "-c", "flush", uri)
            status = self.weir("status", "tank").stdout
            self.assertIn("state: DEGRADED", status)
            self.assertIn("action: replace each FAULTED or UNAVAIL member: weir pool replace tank OLD NEW", status)
            state, (read, write, _, _, _) = self.status_row(status, spec_b)
            self.assertEqual(state, "FAULTED")
            self.assertGreater(write, 0)
            self.assertIn("FAULTED", w.logs())
            run("qemu-io", "-f", "raw", "-c", "read -P 0x11 0 32M", "-c", "read -P 0x22 32M 64M", uri)

            out = self.weir("replace", "tank", spec_b, c, "--wait")
            self.assertIn("resilver started", out.stdout)
            self.assertEqual(out.stderr.strip().splitlines()[-1], "resilver: finished; pool ONLINE")
            status = self.weir("status", "tank").stdout
            self.assertIn("state: ONLINE", status)
            # The new member starts with no errors: the old one's were its own.
            self.assertEqual(self.status_row(status, c), ("ONLINE", [0, 0, 0, 0, 0]))
            self.assertIn("errors: none", status)
            run("qemu-io", "-f", "raw", "-c", "read -P 0x11 0 32M", "-c", "read -P 0x22 32M 64M", uri)
            self.assertEqual(w.stop(), 0)
        # The new copy holds what the surviving one holds (data region).
        with open(a, "rb") as fa, open(c, "rb") as fc:
            for at in range(4 * MIB, 100 * MIB, MIB):
                fa.seek(at)
                fc.seek(at)
                self.assertEqual(fa.read(MIB), fc.read(MIB), f"copies differ at {at}")
        # After a restart the pool finds c by its label and is whole.
        self.assertIn("state: ONLINE", self.weir("status", "tank").stdout)
        with Weir("--data-dir", self.data) as w:
            run("qemu-io", "-f", "raw", "-c", "read -P 0x11 0 32M", "-c", "read -P 0x22 32M 64M", w.uri("tank/disk"))

    def test_a_member_taken_offline_misses_writes_and_only_those_are_rebuilt_when_it_is_back(self):
        a, b = self.file("a.img"), self.file("b.img")
        self.weir("create", "tank", "mirror", a, b)
        self.volume("create", "tank/disk", "--size", "64M")
        scrub = lambda: run(WEIR, "scrub", "start", "tank", "--wait", "--data-dir", self.data, timeout=120).stdout
        with Weir("--data-dir", self.data) as w:
            uri = w.uri("tank/disk")
            run("qemu-io", "-f", "raw", "-c", "write -P 0x11 0 32M", "-c", "flush", uri)
            self.assertIn("is OFFLINE", self.weir("offline", "tank", a).stdout)
            status = self.weir("status", "tank").stdout
            self.assertEqual(self.status_row(status, a)[0], "OFFLINE")
            self.assertIn(f"action: bring it back with weir pool online tank {a}", status)
            self.assertIn('state="OFFLINE"} 1', fetch_metrics(self.data))
            run("qemu-io", "-f", "raw", "-c", "write -P 0x22 16M 32M", "-c", "flush", uri)
            last = self.weir("offline", "tank", b, check=False)
            self.assertNotEqual(last.returncode, 0)
            self.assertIn("only complete copy", last.stderr)
            back = self.weir("online", "tank", a, "--wait")
            self.assertEqual(back.stderr.strip().splitlines()[-1], "resilver: finished; pool ONLINE")
            run("qemu-io", "-f", "raw", "-c", "read -P 0x11 0 16M", "-c", "read -P 0x22 16M 32M", uri)
            # The rebuild copied what a missed: the copies agree.
            self.assertIn("0 repaired, 0 unrecoverable", scrub())
            self.assertNotEqual(self.weir("online", "tank", a, check=False).returncode, 0, "not offline")
            # replace with no NEW rebuilds the member in place, whole.
            rebuilt = self.weir("replace", "tank", b, "--wait")
            self.assertEqual(rebuilt.stderr.strip().splitlines()[-1], "resilver: finished; pool ONLINE")
            self.assertIn("0 repaired, 0 unrecoverable", scrub())
            run("qemu-io", "-f", "raw", "-c", "read -P 0x11 0 16M", "-c", "read -P 0x22 16M 32M", uri)
            self.assertEqual(w.stop(), 0)
        offline_cmd = self.weir("offline", "tank", a, check=False)
        self.assertIn("only a served pool has members in service", offline_cmd.stderr)

    def test_replace_refuses_another_pools_device_and_an_unknown_member(self):
        a, b, c, d = (self.file(n) for n in ("a.img", "b.img", "c.img", "d.img"))
        self.weir("create", "tank", "mirror", a, b)
        self.weir("create", "other", "mirror", c, d)
        self.volume("create", "tank/disk", "--size", "16M")
        taken = self.weir("replace", "tank", b, c, check=False)
        self.assertNotEqual(taken.returncode, 0)
        self.assertIn('belongs to pool "other"', taken.stderr)
        unknown = self.weir("replace", "tank", "/nowhere.img", d, check=False)
        self.assertNotEqual(unknown.returncode, 0)
        self.assertIn("has no member /nowhere.img", unknown.stderr)
        small = self.file("small.img", 8 * MIB)
        tiny = self.weir("replace", "tank", b, small, check=False)
        self.assertNotEqual(tiny.returncode, 0)
        self.assertIn("too small", tiny.stderr)

    def test_a_served_pool_refuses_a_replacement_that_holds_data_or_is_tiny(self):
        a, b = self.file("a.img"), self.file("b.img")
        self.weir("create", "tank", "mirror", a, b)
        self.volume("create", "tank/disk", "--size", "16M")
        used = self.file("notes.db", 128 * MIB)
        with open(used, "r+b") as f:
            f.seek(64 * MIB)
            f.write(b"someone else's data")
        tiny = os.path.join(self.dir, "tiny.img")
        with open(tiny, "wb") as f:
            f.write(b"thirteen byte")
        with Weir("--data-dir", self.data) as w:
            for target, reason in ((used, "is in use: it holds data"), (tiny, "too small")):
                refused = self.weir("replace", "tank", b, target, check=False)
                self.assertNotEqual(refused.returncode, 0, target)
                self.assertIn(reason, refused.stderr, target)
            # The server answers as before and the pool is untouched.
            status = self.weir("status", "tank").stdout
            self.assertIn("state: ONLINE", status)
            self.assertEqual(self.status_row(status, b)[0], "ONLINE")
            self.assertEqual(w.stop(), 0)
            self.assertNotIn("panicked", w.logs())
        with open(used, "rb") as f:
            f.seek(64 * MIB)
            self.assertEqual(f.read(19), b"someone else's data")
        with open(tiny, "rb") as f:
            self.assertEqual(f.read(), b"thirteen byte")


    def test_the_admin_endpoint_is_its_owners_alone(self):
        a, b = self.file("a.img"), self.file("b.img")
        self.weir("create", "tank", "mirror", a, b)
        # By default: a Unix socket only the server's user may open.
        with Weir("--data-dir", self.data) as w:
            with open(os.path.join(self.data, "admin.addr")) as f:
                socket_path = f.read().strip().removeprefix("unix:")
            self.assertEqual(os.stat(socket_path).st_mode & 0o777, 0o600)
            self.assertIn("fifo", self.weir("sched", "tank", "fifo").stdout)
            status, _ = admin_call(self.data, "POST", "/v1/sched?pool=tank&mode=zfs",
                                   headers={"Origin": "https://example.com"})
            self.assertEqual(status, 403)
            self.assertEqual(w.stop(), 0)
        self.assertFalse(os.path.exists(socket_path))
        # On loopback TCP every request needs the token; web pages and other
        # hosts' names are refused before that.
        with Weir("--data-dir", self.data, "--admin", "127.0.0.1:0") as w:
            self.assertEqual(os.stat(os.path.join(self.data, "admin.token")).st_mode & 0o777, 0o600)
            with open(os.path.join(self.data, "admin.addr")) as f:
                lines = f.read().split()
            self.assertTrue(lines[0].startswith("unix:"), lines)
            host, port = lines[1].removeprefix("http://").rsplit(":", 1)
            refusals = [
                ({}, False, 401),
                ({"Authorization": "Bearer wrong"}, False, 401),
                ({"Origin": "https://example.com"}, True, 403),
                ({"Host": f"attacker.example:{port}"}, True, 403),
            ]
            for headers, token, expected in refusals:
                status, body = admin_call(self.data, "POST", "/v1/sched?pool=tank&mode=zfs",
                                          headers=headers, token=token, tcp=True)
                self.assertEqual(status, expected, (headers, body))
            self.assertEqual(admin_call(self.data, "GET", "/metrics", token=False, tcp=True)[0], 401)
            self.assertEqual(admin_call(self.data, "GET", "/metrics", tcp=True)[0], 200)
            with open(os.path.join(self.data, "pools.toml")) as f:
                self.assertNotIn("zfs", f.read())
            # Bytes that are not HTTP get 400 or a closed connection, never a dead endpoint.
            for raw in (b"GARBAGE\r\n\r\n", b"\x00\xff" * 100 + b"\r\n\r\n"):
                with socket.create_connection((host, int(port)), timeout=10) as s:
                    s.sendall(raw)
                    answer = s.recv(200)
                    self.assertTrue(answer == b"" or answer.startswith(b"HTTP/1.1 400"), answer)
            # Requests at once are answered at once, each on its own.
            with concurrent.futures.ThreadPoolExecutor(16) as pool:
                statuses = list(pool.map(lambda _: admin_call(self.data, "GET", "/v1/status", tcp=True)[0],
                                         range(32)))
            self.assertTrue(set(statuses) <= {200, 503} and statuses.count(200) >= 8, statuses)
            # The CLI uses the Unix socket, which stays open beside TCP.
            self.assertIn("zfs", self.weir("sched", "tank", "zfs").stdout)
            self.assertEqual(w.stop(), 0)
        self.assertFalse(os.path.exists(os.path.join(self.data, "admin.token")))
        other = os.path.join(self.dir, "other-data")
        refused = subprocess.run([WEIR, "serve", "--listen", "none", "--socket", os.path.join(self.dir, "s.sock"),
                                  "--data-dir", other, "--admin", "0.0.0.0:0"],
                                 capture_output=True, text=True, timeout=60)
        self.assertNotEqual(refused.returncode, 0)
        self.assertIn("which is not loopback, only under TLS", refused.stderr)
        # The demo pool it had opened closed on the way out: nothing held it.
        self.assertNotIn("still held", refused.stderr)


class Scrub(PoolTest):
    def scrub(self, *args, check=True):
        return run(WEIR, "scrub", *args, "--data-dir", self.data, check=check, timeout=120)

    def test_bytes_flipped_under_a_served_mirror_read_back_correct_and_an_online_scrub_repairs_them(self):
        a, b = self.file("a.img", 512 * MIB), self.file("b.img", 512 * MIB)
        self.weir("create", "tank", "mirror", a, b)
        self.volume("create", "tank/disk", "--size", "256M")
        src = os.path.join(self.dir, "src.img")
        with open(src, "wb") as f:
            f.write(os.urandom(32 * MIB))
            f.truncate(256 * MIB)
        with Weir("--data-dir", self.data) as w:
            run("qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", src, w.uri("tank/disk"))
            # Garbage over 4 MiB of one copy, behind the server's back.
            fd = os.open(b, os.O_WRONLY)
            os.pwrite(fd, os.urandom(4 * MIB), 8 * MIB)
            os.fsync(fd)
            os.close(fd)
            run("qemu-img", "compare", "-f", "raw", "-F", "raw", src, w.uri("tank/disk"))
            healed_by_reads = self.status_row(self.weir("status", "tank").stdout, b)[1][3]
            out = self.scrub("start", "tank", "--wait").stdout
            self.assertIn("finished, 100.0%", out)
            by_scrub = int(out.split(" repaired")[0].rsplit(" ", 1)[1])
            self.assertEqual(healed_by_reads + by_scrub, 1024, "every bad 4 KiB block of b, once")  # 4 MiB
            state, (read, write, cksum, repaired, _) = self.status_row(self.weir("status", "tank").stdout, b)
            self.assertEqual((state, read, write, repaired), ("ONLINE", 0, 0, 1024))
            self.assertEqual(cksum, 1024)
            self.assertIn("0 repaired, 0 unrecoverable", self.scrub("start", "tank", "--wait").stdout)
            self.assertIn("finished", self.scrub("status", "tank").stdout)
            metrics = fetch_metrics(self.data)
            self.assertIn('weir_member_repaired_blocks_total{pool="tank",group="0",member="1"', metrics)
            self.assertIn("# TYPE weir_device_latency_seconds histogram", metrics)
            self.assertRegex(metrics, r"weir_device_latency_seconds_sum\{[^}]*class=\"scrub\"\} [0-9.e-]+")
            self.assertRegex(metrics, r'weir_device_ops_total\{[^}]*class="scrub"\} [1-9]')
            # The status says what happened and what to do; clear forgets it.
            status = self.weir("status", "tank").stdout
            self.assertIn("status: a member returned errors; each was corrected from another copy", status)
            self.assertIn("then weir pool clear tank", status)
            self.assertIn("errors: 1024 on its members", status)
            self.assertIn("error counts of 1 member cleared", self.weir("clear", "tank", b).stdout)
            status = self.weir("status", "tank").stdout
            self.assertEqual(self.status_row(status, b)[1][:4], [0, 0, 0, 0])
            self.assertNotIn("status:", status)
            self.assertIn("errors: none", status)
            self.assertNotEqual(self.weir("clear", "tank", "nosuch", check=False).returncode, 0)
            self.assertEqual(w.stop(), 0)
        refused = self.weir("clear", "tank", check=False)
        self.assertIn("error counts live in the running server", refused.stderr)
        with open(a, "rb") as fa, open(b, "rb") as fb:
            fa.seek(8 * MIB)
            fb.seek(8 * MIB)
            self.assertEqual(fa.read(4 * MIB), fb.read(4 * MIB), "the copies agree again")

    def test_an_online_scrub_pauses_resumes_and_stops(self):
        # HDD models make the scrub slow enough to catch in the middle.
        a, b = self.file("a.img", 512 * MIB), self.file("b.img", 512 * MIB)
        models = [f"model:hdd,size=512M,store=file:{p}" for p in (a, b)]
        self.weir("create", "tank", "mirror", *models)
        self.volume("create", "tank/disk", "--size", "256M")
        with Weir("--data-dir", self.data) as w:
            run("qemu-io", "-f", "raw", "-c", "write -P 0x5a 0 192M", w.uri("tank/disk"), timeout=120)
            self.assertIn("running", self.scrub("start", "tank").stdout)
            busy = self.scrub("start", "tank", check=False)
            self.assertNotEqual(busy.returncode, 0)
            self.assertIn("already running", busy.stderr)
            paused = self.scrub("pause", "tank").stdout
            self.assertIn("paused", paused)
            done_at_pause = paused.split("(")[1].split(" of")[0]
            time.sleep(1)
            self.assertIn(f"({done_at_pause} of", self.scrub("status", "tank").stdout, "no progress while paused")
            self.assertIn("scrub tank: paused", self.weir("status", "tank").stdout)
            self.scrub("resume", "tank")
            # While it runs: the queues per class, with latency histograms.
            io = run(WEIR, "iostat", "-w", "0.5", "--count", "1", "--data-dir", self.data, timeout=30).stdout
            self.assertRegex(io, r"tank\s+\S+a\.img\s+scrub\s+[0-9.]+\s+[0-9.]+")
            # In adaptive mode the scrub has a floor of device time.
            self.assertRegex(io, r"a\.img\s+scrub\s+[0-9.]+\s+[0-9.]+\s+\d+\s+\d+\s+\d+%")
            self.assertIn("then resilver, then scrub", io)
            self.assertIn("tank: latency (submission to completion)", io)
            self.assertEqual(self.weir("sched", "tank").stdout.strip(), "pool tank: adaptive")
            self.assertIn("now zfs", self.weir("sched", "tank", "zfs").stdout)
            self.assertIn("sched: zfs", self.weir("status", "tank").stdout)
            bad = self.weir("sched", "tank", "elevator", check=False)
            self.assertNotEqual(bad.returncode, 0)
            self.assertIn("unknown mode", bad.stderr)
            deadline = time.time() + 60
            while "finished" not in (out := self.scrub("status", "tank").stdout) and time.time() < deadline:
                time.sleep(0.2)
            self.assertIn("finished, 100.0%", out)
            # Paused, resumed and switched between modes, it still found
            # every copy good.
            self.assertIn("0 repaired, 0 unrecoverable", out)
            run("qemu-io", "-f", "raw", "-c", "read -P 0x5a 0 192M", w.uri("tank/disk"), timeout=120)
            self.scrub("start", "tank")
            self.assertIn("stopped", self.scrub("stop", "tank").stdout)
            again = self.scrub("stop", "tank", check=False)
            self.assertNotEqual(again.returncode, 0)
            self.assertEqual(w.stop(), 0)
        self.assertIn("stopped", self.scrub("status", "tank").stdout)
        self.assertEqual(self.weir("sched", "tank").stdout.strip(), "pool tank: zfs", "the mode is remembered")

    def test_scrub_reads_sent_in_pieces_beside_client_reads_put_back_together_verify(self):
        # With client reads beside it, the adaptive queue measures both and
        # sends the scrub's 1 MiB reads in pieces; each is read into a
        # buffer of its own and copied back.
        a, b = self.file("a.img", 512 * MIB), self.file("b.img", 512 * MIB)
        models = [f"model:hdd,size=512M,store=file:{p}" for p in (a, b)]
        self.weir("create", "tank", "mirror", *models)
        self.volume("create", "tank/disk", "--size", "256M")
        # Random data: a piece copied to the wrong place must not match.
        src = os.path.join(self.dir, "src.img")
        with open(src, "wb") as f:
            f.write(os.urandom(128 * MIB))
            f.truncate(256 * MIB)
        with Weir("--data-dir", self.data) as w:
            run("qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", src, w.uri("tank/disk"), timeout=120)
            with open(src, "rb") as f:
                expected = f.read(120 * MIB)
            # 4 KiB reads all through the scrub, each checked.
            scrubbing = threading.Event()
            scrubbing.set()
            reads, wrong = [0], []

            def reader():
                h = nbd.NBD()
                h.connect_uri(w.uri("tank/disk"))
                while scrubbing.is_set() and reads[0] < 100000:
                    at = (reads[0] * 37 * 4096) % (120 * MIB)
                    if h.pread(4096, at) != expected[at:at + 4096]:
                        wrong.append(at)
                    reads[0] += 1
                h.shutdown()

            thread = threading.Thread(target=reader)
            thread.start()
            self.scrub("start", "tank")
            deadline = time.time() + 60
            while "finished" not in (out := self.scrub("status", "tank").stdout) and time.time() < deadline:
                time.sleep(0.05)
            scrubbing.clear()
            thread.join(timeout=60)
            self.assertIn("finished, 100.0%", out)
            self.assertIn("0 repaired, 0 unrecoverable", out)
            self.assertGreater(reads[0], 5, "client reads ran beside the scrub")
            self.assertEqual(wrong, [], "every client read returned its data")
            metrics = fetch_metrics(self.data)
            self.assertRegex(metrics, r'weir_device_pieces_total\{[^}]*class="scrub"\} [1-9]')
            floors = [float(m) for m in re.findall(r'weir_device_floor_share\{[^}]*class="scrub"\} (\S+)', metrics)]
            self.assertTrue(floors and all(0 < f < 1 for f in floors), floors)
            run("qemu-img", "compare", "-f", "raw", "-F", "raw", src, w.uri("tank/disk"), timeout=120)
            self.assertEqual(w.stop(), 0)

    def test_an_interrupted_scrub_resumes_from_its_checkpoint(self):
        a, b = self.file("a.img"), self.file("b.img")
        self.weir("create", "tank", "mirror", a, b)
        self.volume("create", "tank/disk", "--size", "16M")
        total = int(self.scrub("start", "tank").stdout.split(" of ")[1].split()[0])
        with open(os.path.join(self.data, "scrub-tank.json"), "w") as f:
            json.dump({"state": "running", "group": 0, "chunk": 100, "chunks_done": 100, "chunks_total": total,
                       "bytes_read": 0, "repaired": 0, "unrecoverable": 0, "seconds": 1.0}, f)
        result = self.scrub("start", "tank")
        self.assertIn("resuming the scrub of tank at 100", result.stderr)
        self.assertIn(f"({total} of {total} chunks)", result.stdout)


if __name__ == "__main__":
    unittest.main()


class ReadPolicies(PoolTest):
    def test_read_policies_switch_at_run_time_and_every_one_reads_correct_data(self):
        a, b = self.file("a.img", 512 * MIB), self.file("b.img", 512 * MIB)
        models = [f"model:{kind},size=512M,store=file:{p}" for kind, p in (("nvme", a), ("ssd", b))]
        self.weir("create", "tank", "mirror", *models)
        self.volume("create", "tank/disk", "--size", "64M")
        src = os.path.join(self.dir, "src.img")
        with open(src, "wb") as f:
            f.write(os.urandom(64 * MIB))
        # Read-ahead would turn the client's reads into fewer, larger ones.
        with Weir("--data-dir", self.data, "--readahead", "off") as w:
            run("qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", src, w.uri("tank/disk"))
            self.assertEqual(self.weir("read-policy", "tank").stdout.strip(), "pool tank: latency", "the default")
            for policy in ("pid", "round-robin", "least-pending", "latency"):
                self.assertIn(f"reads now {policy}", self.weir("read-policy", "tank", policy).stdout)
                before = self.weir("status", "tank").stdout
                run("qemu-img", "compare", "-f", "raw", "-F", "raw", src, w.uri("tank/disk"))
                after = self.weir("status", "tank", "-v").stdout
                self.assertIn(f"reads: {policy}", after)
                self.assertIn(f"read selection ({policy})", after)
                grew = [self.status_row(after, m)[1][4] - self.status_row(before, m)[1][4] for m in models]
                self.assertEqual(sum(grew), 64, f"{policy}: one read per 1 MiB chunk: {grew}")
                if policy == "pid":
                    # One connection asks for everything: one copy serves it.
                    self.assertIn(0, grew, grew)
                if policy == "round-robin":
                    self.assertEqual(grew, [32, 32], "256 KiB turns over 1 MiB reads: one each in turn")
            bad = self.weir("read-policy", "tank", "fastest", check=False)
            self.assertNotEqual(bad.returncode, 0)
            self.assertIn("want pid, round-robin, least-pending, latency", bad.stderr)
            status, body = admin_call(self.data, "POST", "/v1/read-policy?pool=tank")
            self.assertEqual(status, 409)
            self.assertIn("missing policy=", body)
            metrics = fetch_metrics(self.data)
            self.assertRegex(metrics, r'weir_member_read_share\{pool="tank",group="0",member="0"[^}]*\} 0\.\d+')
            self.assertRegex(metrics, r'weir_member_read_service_seconds\{[^}]*kind="other"\} \d')
            self.assertIn('weir_member_read_passed_over{pool="tank",group="0",member="1"', metrics)
            self.weir("read-policy", "tank", "round-robin")
            self.assertEqual(w.stop(), 0)
        self.assertEqual(self.weir("read-policy", "tank").stdout.strip(), "pool tank: round-robin", "remembered")
        self.assertIn("reads will be pid when served", self.weir("read-policy", "tank", "pid").stdout)
        offline = self.weir("status", "tank").stdout
        self.assertIn(" reads: pid", offline)
        self.assertIn(" sched: adaptive", offline)
