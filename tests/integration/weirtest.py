"""Helpers for integration tests: start the real weir binary, talk to it."""

import http.client
import os
import re
import signal
import socket
import ssl
import subprocess
import tempfile
import time

WEIR = os.environ.get("WEIR_BIN", os.path.join(os.path.dirname(__file__), "../../target/release/weir"))
STARTUP_TIMEOUT_S = 20


class Weir:
    """A weir server on a private Unix socket (and optionally TCP)."""

    def __init__(self, *args, tcp=False, workdir=None):
        self.tmp = tempfile.TemporaryDirectory(prefix="weir-test-")
        self.dir = workdir or self.tmp.name
        self.socket = os.path.join(self.tmp.name, "weir.sock")
        self.log_path = os.path.join(self.tmp.name, "weir.log")
        self.args = list(args)
        self.tcp = tcp
        self.proc = None
        self.tcp_addr = None

    def start(self):
        listen = ["--listen", "127.0.0.1:0"] if self.tcp else ["--listen", "none"]
        cmd = [WEIR, "serve", "--socket", self.socket, *listen, *self.args]
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, cwd=self.dir, text=True)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"weir did not start: {' '.join(cmd)}\n{self.logs()}")
        if self.tcp:
            self.tcp_addr = line.split("nbd://", 1)[1].split("/", 1)[0]
        deadline = time.time() + STARTUP_TIMEOUT_S
        while not os.path.exists(self.socket):
            if time.time() > deadline:
                raise RuntimeError("weir socket never appeared\n" + self.logs())
            time.sleep(0.01)
        return self

    def uri(self, export="default"):
        return f"nbd+unix:///{export}?socket={self.socket}"

    def tcp_uri(self, export="default"):
        return f"nbd://{self.tcp_addr}/{export}"

    def logs(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def stop(self, sig=signal.SIGTERM, timeout=30):
        """Stop the server; returns its exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=timeout)
        self.proc.stdout.close()
        self.log.close()
        self.proc = None
        return code

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        if self.proc is not None:
            self.stop(signal.SIGKILL)
        self.tmp.cleanup()


def run(*cmd, timeout=300, check=True, **kw):
    """Run a client command; raise with its output if it fails."""
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


def raw_connection(path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(path)
    return sock


def recv_exact(sock, count):
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise EOFError(f"closed after {len(data)} of {count} bytes")
        data += chunk
    return data


def read_until_closed(sock):
    """Read and drop whatever comes until the server closes the socket."""
    sock.settimeout(10)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    sock.close()


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=30):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def admin_call(data_dir, method, path, headers=None, token=True, tcp=False, cafile=None):
    """(status, body) of one call to the admin endpoint of the server
    holding `data_dir`: on its Unix socket, or with `tcp` on its TCP
    address (HTTPS trusting `cafile` when it speaks TLS) with its token."""
    with open(os.path.join(data_dir, "admin.addr")) as f:
        lines = f.read().split()
    headers = dict(headers or {})
    if not tcp:
        conn = UnixHTTPConnection(next(l for l in lines if l.startswith("unix:"))[len("unix:"):])
    else:
        scheme, address = next(l for l in lines if l.startswith("http")).split("://", 1)
        host, port = address.rsplit(":", 1)
        if scheme == "https":
            context = ssl.create_default_context(cafile=cafile)
            conn = http.client.HTTPSConnection(host.strip("[]"), int(port), timeout=30, context=context)
        else:
            conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=30)
        if token:
            with open(os.path.join(data_dir, "admin.token")) as f:
                headers.setdefault("Authorization", "Bearer " + f.read().strip())
    try:
        conn.request(method, path, headers=headers)
        answer = conn.getresponse()
        return answer.status, answer.read().decode()
    finally:
        conn.close()


def fetch_metrics(data_dir):
    status, body = admin_call(data_dir, "GET", "/metrics")
    assert status == 200, (status, body)
    return body


def sparse_file(path, size):
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def command_lines(block):
    """The commands of a shell block from the docs: comments and blank lines dropped."""
    lines = []
    for line in block.splitlines():
        line = re.sub(r"(^|\s+)#.*$", "", line).strip()
        if line:
            lines.append(line)
    return lines
