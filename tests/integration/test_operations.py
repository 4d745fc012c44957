"""An operator's day against one running server, with nothing restarted:
pools and volumes created, changed and removed while clients are
connected, a member taken out and replaced, a pool exported and imported
back, and the data intact throughout."""

import os
import signal
import subprocess
import time
import unittest

import nbd

from test_pool import MIB, PoolTest
from weirtest import WEIR, Weir, fetch_metrics, run


class LiveAdministration(PoolTest):
    def connect(self, w, export):
        h = nbd.NBD()
        h.connect_uri(w.uri(export))
        return h

    def exports(self, w):
        listed = run("nbdinfo", "--list", "--json", w.uri("")).stdout
        return [line.split('"')[3] for line in listed.splitlines() if '"export-name"' in line]

    def test_an_operator_story_runs_against_one_server_without_a_restart(self):
        a, b, c = (self.file(n) for n in ("a.img", "b.img", "c.img"))
        with Weir("--data-dir", self.data) as w:
            pid = w.proc.pid
            self.assertIn("state: ONLINE", self.weir("create", "tank", "mirror", a, b).stdout)
            listed = self.volume("create", "tank/db", "--size", "64M").stdout
            self.assertIn("tank/db", listed)
            self.assertIn("tank/db", self.exports(w), "a new volume is exported at once")

            h = self.connect(w, "tank/db")
            self.assertEqual(h.get_size(), 64 * MIB)
            first, second = os.urandom(4 * MIB), os.urandom(4 * MIB)
            h.pwrite(first, 0)
            h.flush()

            # A member out of service: the pool serves DEGRADED, the client goes on.
            self.weir("offline", "tank", a)
            self.assertIn("state: DEGRADED", self.weir("status", "tank").stdout)
            h.pwrite(second, 8 * MIB)
            h.flush()
            self.assertEqual(h.pread(4 * MIB, 8 * MIB), second)

            replaced = self.weir("replace", "tank", a, c, "--wait")
            self.assertEqual(replaced.stderr.strip().splitlines()[-1], "resilver: finished; pool ONLINE")
            status = self.weir("status", "tank").stdout
            self.assertEqual(self.status_row(status, c)[0], "ONLINE")
            self.assertNotIn(a, status)
            self.assertIn("error counts of 2 members cleared", self.weir("clear", "tank").stdout)

            # A volume with a client on it is deleted: the client is
            # disconnected, the volume is gone and its space is free.
            self.volume("create", "tank/scratch", "--size", "16M")
            scratch = self.connect(w, "tank/scratch")
            scratch.pwrite(b"s" * 4096, 0)
            self.assertIn("volume tank/scratch deleted", self.volume("delete", "tank/scratch").stdout)
            with self.assertRaises(nbd.Error):
                scratch.pread(4096, 0)
            self.assertNotIn("tank/scratch", self.volume("list").stdout)
            self.assertNotIn("tank/scratch", self.exports(w))
            # Its space, reused, reads as zeroes.
            self.volume("create", "tank/fresh", "--size", "16M")
            fresh = self.connect(w, "tank/fresh")
            self.assertEqual(fresh.pread(4096, 0), bytes(4096))
            fresh.shutdown()

            # Resize: the client is disconnected and sees the new size on
            # reconnecting; the data stays.
            resized = self.volume("resize", "tank/db", "--size", "48M", check=False)
            self.assertEqual(resized.returncode, 0, resized.stderr)
            with self.assertRaises(nbd.Error):
                h.pread(4096, 0)
            h = self.connect(w, "tank/db")
            self.assertEqual(h.get_size(), 48 * MIB)
            self.assertEqual(h.pread(4 * MIB, 0), first)
            h.shutdown()

            # Export the pool and import it back from its devices.
            exported = self.weir("export", "tank").stdout
            self.assertIn("pool tank exported", exported)
            self.assertNotIn("tank", self.weir("list").stdout)
            self.assertNotIn("tank/db", self.exports(w))
            imported = self.weir("import", c, b).stdout
            self.assertIn("state: ONLINE", imported)
            h = self.connect(w, "tank/db")
            self.assertEqual(h.pread(4 * MIB, 0), first)
            self.assertEqual(h.pread(4 * MIB, 8 * MIB), second)
            h.shutdown()
            scrubbed = run(WEIR, "scrub", "start", "tank", "--wait", "--data-dir", self.data, timeout=120).stdout
            self.assertIn("0 repaired, 0 unrecoverable", scrubbed)
            self.assertIn('weir_pool_state{pool="tank",state="ONLINE"} 1', fetch_metrics(self.data))

            # Destroy: the devices are free for a new pool (with --force,
            # as they hold data), all on the same server.
            self.assertIn("pool tank destroyed", self.weir("destroy", "tank").stdout)
            self.assertIn("holds data", self.weir("create", "new", "mirror", b, c, check=False).stderr)
            self.weir("create", "new", "mirror", b, c, "--force")
            self.assertIn("new", self.weir("list").stdout)

            self.assertTrue(w.alive())
            self.assertEqual(w.proc.pid, pid)
            self.assertEqual(w.stop(), 0)

    def test_changes_that_cannot_be_made_are_refused_and_the_server_keeps_serving(self):
        a, b = self.file("a.img"), self.file("b.img")
        with Weir("--data-dir", self.data) as w:
            self.weir("create", "tank", "mirror", a, b)
            self.volume("create", "tank/one", "--size", "16M")
            self.volume("create", "tank/two", "--size", "16M")
            cases = [
                (("volume", "create", "tank/one", "--size", "1M"), "already exists"),
                (("volume", "create", "tank/big", "--size", "100G"), "has no room"),
                (("volume", "create", "nosuch/v", "--size", "1M"), "no pool named"),
                (("volume", "resize", "tank/one", "--size", "64M"), "cannot grow"),
                (("volume", "delete", "tank/nosuch"), "no volume tank/nosuch"),
                (("pool", "create", "tank", "mirror", a, b), "already exists"),
                (("pool", "export", "nosuch"), "no pool named"),
            ]
            for args, message in cases:
                result = run(WEIR, *args, "--data-dir", self.data, check=False)
                self.assertNotEqual(result.returncode, 0, args)
                self.assertIn(message, result.stderr, args)
                self.assertEqual(len(result.stderr.strip().splitlines()), 1, result.stderr)
            h = self.connect(w, "tank/two")
            h.pwrite(b"x" * 4096, 0)
            self.assertEqual(h.pread(4096, 0), b"x" * 4096)
            h.shutdown()
            self.assertEqual(w.stop(), 0)


class KillNine(PoolTest):
    def test_live_changes_and_flushed_data_survive_kill_9(self):
        a, b = self.file("a.img"), self.file("b.img")
        data = os.urandom(2 * MIB)
        with Weir("--data-dir", self.data) as w:
            self.weir("create", "tank", "mirror", a, b)
            self.volume("create", "tank/kept", "--size", "16M")
            self.volume("create", "tank/gone", "--size", "16M")
            self.volume("set", "tank/kept", "--description", "kept")
            h = nbd.NBD()
            h.connect_uri(w.uri("tank/kept"))
            h.pwrite(data, MIB)
            h.flush()
            self.volume("delete", "tank/gone")
            w.stop(signal.SIGKILL)
        with Weir("--data-dir", self.data) as w:
            listed = self.volume("list").stdout
            self.assertRegex(listed, r"tank/kept\s+16777216\s+4096\s+off\s+-\s+kept")
            self.assertNotIn("tank/gone", listed)
            h = nbd.NBD()
            h.connect_uri(w.uri("tank/kept"))
            self.assertEqual(h.pread(2 * MIB, MIB), data)
            h.shutdown()
            self.assertIn("0 repaired, 0 unrecoverable",
                          run(WEIR, "scrub", "start", "tank", "--wait", "--data-dir", self.data, timeout=120).stdout)
            self.assertEqual(w.stop(), 0)


class VolumeProperties(PoolTest):
    def test_properties_are_set_live_and_offline_and_travel_with_the_pool(self):
        a, b = self.file("a.img"), self.file("b.img")
        self.weir("create", "tank", "mirror", a, b)
        self.volume("create", "tank/golden", "--size", "16M")
        self.volume("create", "tank/work", "--size", "16M")
        # Offline: kept in the pool's volume table.
        shown = self.volume("set", "tank/golden", "--description", "base image").stdout
        self.assertRegex(shown, r"tank/golden\s+16777216\s+4096\s+off\s+-\s+base image")
        with Weir("--data-dir", self.data) as w:
            h = nbd.NBD()
            h.connect_uri(w.uri("tank/golden"))
            h.pwrite(b"g" * 4096, 0)
            h.flush()
            # Live: the volume is served anew, read-only; its client reconnects.
            self.volume("set", "tank/golden", "--read-only", "on", "--cache", "writethrough")
            with self.assertRaises(nbd.Error):
                h.pread(4096, 0)
            h = nbd.NBD()
            h.connect_uri(w.uri("tank/golden"))
            self.assertTrue(h.is_read_only())
            self.assertEqual(h.pread(4096, 0), b"g" * 4096)
            h.shutdown()
            listed = run("nbdinfo", "--list", w.uri("")).stdout
            self.assertIn("description: base image", listed)
            status = self.weir("status", "tank").stdout
            self.assertNotIn("volume golden: write-back cache", status)
            self.assertIn("volume work: write-back cache", status)
            refused = self.volume("set", "tank/golden", "--cache", "sometimes", check=False)
            self.assertNotEqual(refused.returncode, 0)
            self.assertIn("want writeback, writethrough or default", refused.stderr)
            self.weir("export", "tank")
            self.weir("import", a, b)
            listed = self.volume("list").stdout
            self.assertRegex(listed, r"tank/golden\s+16777216\s+4096\s+on\s+writethrough\s+base image")
            h = nbd.NBD()
            h.connect_uri(w.uri("tank/golden"))
            self.assertTrue(h.is_read_only(), "the property came back with the pool")
            h.shutdown()
            self.assertEqual(w.stop(), 0)


class Reload(PoolTest):
    def write_config(self, text):
        with open(self.config, "w") as f:
            f.write(text)

    def wait_for_log(self, w, text, count):
        deadline = time.time() + 20
        while w.logs().count(text) < count:
            self.assertLess(time.time(), deadline, f"no {text!r} in the log:\n{w.logs()}")
            time.sleep(0.05)

    def test_sighup_applies_export_changes_and_refuses_a_broken_file(self):
        one, two = self.file("one.img", 16 * MIB), self.file("two.img", 16 * MIB)
        self.config = os.path.join(self.dir, "weir.toml")
        self.write_config(f'[[export]]\nname = "one"\ndevice = "{one}"\n')
        with Weir("--config", self.config, "--data-dir", self.data) as w:
            h = nbd.NBD()
            h.connect_uri(w.uri("one"))
            h.pwrite(b"1" * 4096, 0)
            h.flush()
            # one becomes read-only, two is added.
            self.write_config(
                f'[[export]]\nname = "one"\ndevice = "{one}"\nreadonly = true\n'
                f'[[export]]\nname = "two"\ndevice = "{two}"\n')
            w.proc.send_signal(signal.SIGHUP)
            self.wait_for_log(w, "configuration reloaded: 1 export(s) added, 0 removed, 1 changed", 1)
            with self.assertRaises(nbd.Error):
                h.pread(4096, 0)  # the changed export's client was disconnected
            h = nbd.NBD()
            h.connect_uri(w.uri("one"))
            self.assertTrue(h.is_read_only())
            self.assertEqual(h.pread(4096, 0), b"1" * 4096)
            h.shutdown()
            # A file that does not parse changes nothing.
            self.write_config("[[export]\n")
            w.proc.send_signal(signal.SIGHUP)
            self.wait_for_log(w, "configuration not reloaded, nothing changed", 1)
            listed = run("nbdinfo", "--list", w.uri("")).stdout
            self.assertIn('export="one"', listed)
            self.assertIn('export="two"', listed)
            # one removed.
            self.write_config(f'[[export]]\nname = "two"\ndevice = "{two}"\n')
            w.proc.send_signal(signal.SIGHUP)
            self.wait_for_log(w, "0 export(s) added, 1 removed, 0 changed", 1)
            listed = run("nbdinfo", "--list", w.uri("")).stdout
            self.assertNotIn('export="one"', listed)
            self.assertEqual(w.stop(), 0)


if __name__ == "__main__":
    unittest.main()
