"""docs/operations.md's commands run as shown, in the order shown, against
one running server: its pools, volumes, replace, scrub, iostat, metrics
and scheduling examples. Made real here:
- /srv/NAME.img, the example members, are HDD models stored in files in a
  temporary directory (so that a scrub is slow enough to pause), and
  /dev/sdX are sparse files;
- volume sizes in G become M, so that the members stay small;
- weir-data is the test's data directory, and the admin port is the one
  the server picked.
Lines that cannot run on a test machine are listed below with why; every
other line must exit 0."""

import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
import unittest

from weirtest import WEIR, command_lines, run

DOC = os.path.join(os.path.dirname(__file__), "../../docs/operations.md")
REPO = os.path.join(os.path.dirname(__file__), "../..")

# Prefixes of lines not run, with the reason.
NOT_RUN = {
    "cp dist/systemd": "installs into /etc/systemd",
    "mkdir -p /etc/weir": "writes /etc",
    "systemctl": "needs systemd as init",
    "curl -s --cacert /etc/weir/tls": "a placeholder host (storage-1.example)",
    "weir bench calibrate": "a benchmark of minutes (bench/ and test_models run them)",
    "weir bench scrub-vs-randread": "a benchmark of minutes",
    "weir bench writeback-vs-randread": "a benchmark of minutes",
    "weir bench scheduler": "a benchmark of minutes",
    "weir bench mirror-reads": "a benchmark of minutes",
}


def shell_lines(path):
    """Every line of every ```sh block, in order; comments dropped."""
    with open(path) as f:
        text = f.read()
    return [line for block in re.findall(r"```sh\n(.*?)```", text, re.S) for line in command_lines(block)]


class OperationsDoc(unittest.TestCase):
    def test_every_command_runs_as_shown(self):
        lines = shell_lines(DOC)
        self.assertGreater(len(lines), 25, lines)
        with tempfile.TemporaryDirectory(prefix="weir-docs-") as tmp:
            self.tmp = tmp
            self.data = os.path.join(tmp, "weir-data")
            server = subprocess.Popen(
                [WEIR, "serve", "--data-dir", self.data, "--listen", "127.0.0.1:0",
                 "--admin", "127.0.0.1:0", "--log-level", "warn"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            try:
                self.nbd_addr = server.stdout.readline().split("nbd://", 1)[1].split("/", 1)[0]
                self.admin_port = self.wait_for_admin_port()
                ran = []
                for line in lines:
                    skip = next((why for prefix, why in NOT_RUN.items() if line.startswith(prefix)), None)
                    if skip:
                        continue
                    if line.startswith("weir scrub start tank") and not ran_scrub_setup(ran):
                        self.write_data_to_scrub()
                        ran.append("scrub setup")
                    self.run_line(line)
                    ran.append(line)
                self.assertIn("weir pool online tank /srv/c.img --wait", ran)
                self.assertTrue(any(r.startswith("curl") for r in ran), ran)
                self.assertTrue(os.path.exists(os.path.join(tmp, "bench/results/models/scheduler-sim.png")))
            finally:
                server.terminate()
                self.assertEqual(server.wait(timeout=120), 0)

    def wait_for_admin_port(self):
        addr_file = os.path.join(self.data, "admin.addr")
        deadline = time.time() + 30
        while True:
            if os.path.exists(addr_file):
                lines = open(addr_file).read().split()
                if len(lines) == 2:
                    return lines[1].rsplit(":", 1)[1]
            self.assertLess(time.time(), deadline, "the admin endpoint never came up")
            time.sleep(0.05)

    def real(self, word):
        """One word of a documented command, made real here."""
        member = re.fullmatch(r"/srv/(\w+)\.img", word)
        if member:
            return f"model:hdd,size=1G,store=file:{self.tmp}/{member.group(1)}.img"
        disk = re.fullmatch(r"/dev/(sd\w)", word)
        if disk:
            path = os.path.join(self.tmp, disk.group(1) + ".img")
            if not os.path.exists(path):
                with open(path, "wb") as f:
                    f.truncate(256 << 20)
            return path
        word = re.sub(r"^(\d+)G$", r"\1M", word)
        word = word.replace("weir-data", self.data).replace("127.0.0.1:10810", f"127.0.0.1:{self.admin_port}")
        return word

    def run_line(self, line):
        if line.startswith("curl"):
            # The shell's $(cat ...) as the doc has it.
            command = line.replace("weir-data", self.data).replace("127.0.0.1:10810", f"127.0.0.1:{self.admin_port}")
            result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
            self.assertEqual(result.returncode, 0, f"{line}\n{result.stderr}")
            self.assertIn("weir_pool_state", result.stdout, line)
            return
        words = [self.real(w) for w in shlex.split(line)]
        self.assertEqual(words[0], "weir", line)
        cmd = [WEIR, *words[1:]]
        if words[1] in ("pool", "volume", "scrub", "iostat") and "--data-dir" not in words:
            cmd += ["--data-dir", self.data]
        if words[1] == "iostat" and "--count" not in words:
            cmd += ["--count", "1"]
        if words[1] == "bench":
            # In a scratch directory, with a copy of any report it reads, so
            # that nothing of the repository is written.
            for word in words[2:]:
                if word.startswith("bench/"):
                    os.makedirs(os.path.join(self.tmp, os.path.dirname(word)), exist_ok=True)
                    shutil.copy(os.path.join(REPO, word), os.path.join(self.tmp, word))
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=self.tmp)
        self.assertEqual(result.returncode, 0, f"{line}\n{' '.join(cmd)}\n{result.stdout}\n{result.stderr}")
        if words[1:3] == ["pool", "status"]:
            self.assertIn("pool: tank", result.stdout)
        if words[1:3] == ["scrub", "pause"]:
            self.assertIn("paused", result.stdout)
        if line.endswith("--wait") and words[1] == "pool":
            self.assertEqual(result.stderr.strip().splitlines()[-1], "resilver: finished; pool ONLINE", line + "\n" + result.stderr[-2000:])

    def write_data_to_scrub(self):
        """A volume with data, so that the scrub has chunks to read."""
        run(WEIR, "volume", "create", "tank/data", "--size", "64M", "--data-dir", self.data)
        source = os.path.join(self.tmp, "data.bin")
        with open(source, "wb") as f:
            f.write(os.urandom(64 << 20))
        run("nbdcopy", source, f"nbd://{self.nbd_addr}/tank/data")


def ran_scrub_setup(ran):
    return "scrub setup" in ran


if __name__ == "__main__":
    unittest.main()
