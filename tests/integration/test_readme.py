"""The README's commands run as shown: the pools quick start, line by line,
on files in a temporary directory, with the server it starts answering a
real client; and the two set-up commands' server (`weir serve` on its
embedded default) serving the demo volume it announces."""

import os
import re
import shlex
import signal
import subprocess
import tempfile
import time
import unittest

from weirtest import WEIR, command_lines, run

README = os.path.join(os.path.dirname(__file__), "../../README.md")
MEMBER_BYTES = 12 << 30  # sparse; the quick start makes 10 GiB and 1 GiB volumes


def shell_block_after(heading):
    """The lines of the first ```sh block after `heading`, comments dropped."""
    with open(README) as f:
        text = f.read()
    start = text.index(heading)
    block = text[start:].split("```sh\n", 1)[1].split("```", 1)[0]
    return command_lines(block)


class PoolsQuickStart(unittest.TestCase):
    def test_every_line_runs_as_shown(self):
        lines = shell_block_after("## Pools quick start")
        self.assertGreaterEqual(len(lines), 6, lines)
        with tempfile.TemporaryDirectory(prefix="weir-readme-") as tmp:
            data = os.path.join(tmp, "weir-data")
            server = None
            try:
                for line in lines:
                    words = shlex.split(line)
                    self.assertEqual(words[0], "weir", line)
                    # The README's example paths, made real here.
                    words = [w.replace("/srv/", tmp + "/").replace("./weir-data", data) for w in words]
                    for word in words:
                        if word.startswith(tmp) and word.endswith(".img") and not os.path.exists(word):
                            with open(word, "wb") as f:
                                f.truncate(MEMBER_BYTES)
                    cmd = [WEIR, *words[1:]]
                    if words[1] == "serve":
                        server = self.start_server(cmd, data)
                        continue
                    if words[1] != "serve" and "--data-dir" not in words:
                        cmd += ["--data-dir", data]
                    if words[1] == "iostat":
                        cmd += ["--count", "1"]
                    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
                    self.assertEqual(result.returncode, 0, f"{line}\n{result.stdout}\n{result.stderr}")
                    if words[1:3] == ["pool", "status"]:
                        self.assertIn("state: ONLINE", result.stdout)
                    if words[1:3] == ["pool", "list"]:
                        self.assertRegex(result.stdout, r"\ntank .* ONLINE\n")
                self.assertIsNotNone(server, "the quick start starts a server")
                # The volume it created is served.
                listed = run("nbdinfo", "--list", f"nbd://{server[1]}").stdout
                self.assertIn("tank/db", listed)
                self.assertIn("tank/logs", listed, "created on the running server, exported at once")
                size = run("nbdinfo", "--size", f"nbd://{server[1]}/tank/db").stdout.strip()
                self.assertEqual(int(size), 10 << 30)
                status = run(WEIR, "pool", "status", "tank", "--data-dir", data).stdout
                self.assertIn(os.path.join(tmp, "c.img"), status)
                self.assertNotIn(os.path.join(tmp, "b.img"), status)
            finally:
                if server is not None:
                    server[0].send_signal(signal.SIGTERM)
                    self.assertEqual(server[0].wait(timeout=60), 0)

    def start_server(self, cmd, data):
        """Start the README's serve line on private ports; (process, host:port)."""
        cmd = cmd + ["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--log-level", "warn"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = proc.stdout.readline()
        self.assertIn("serving nbd://", line)
        addr = line.split("nbd://", 1)[1].split("/", 1)[0]
        deadline = time.time() + 30
        while not os.path.exists(os.path.join(data, "admin.addr")):
            self.assertLess(time.time(), deadline, "the admin endpoint never came up")
            time.sleep(0.05)
        return proc, addr


class TwoCommands(unittest.TestCase):
    def test_serve_with_no_arguments_serves_the_demo_volume_it_announces(self):
        lines = shell_block_after("## Two commands")
        self.assertTrue(lines[0].startswith("cargo run --release -- serve"), lines)
        with tempfile.TemporaryDirectory(prefix="weir-readme-") as tmp:
            # The same binary cargo run builds, in a fresh working directory,
            # on a private port instead of 10809.
            proc = subprocess.Popen([WEIR, "serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"],
                                    cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            try:
                line = proc.stdout.readline()
                uri = re.search(r"nbdinfo '([^']+)'", line).group(1)
                self.assertTrue(uri.endswith("/demo/default"), line)
                info = run("nbdinfo", uri).stdout
                self.assertIn("export-size: 1069547520", info)
                self.assertTrue(os.path.exists(os.path.join(tmp, "weir-data", "pools.toml")))
            finally:
                proc.send_signal(signal.SIGTERM)
                self.assertEqual(proc.wait(timeout=60), 0)


if __name__ == "__main__":
    unittest.main()
