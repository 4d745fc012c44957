"""NBD over TLS and per-export access control, with real clients.

Certificates are made with openssl for each run: a CA, a server
certificate for 127.0.0.1, a client certificate the CA signed, and one a
stranger's CA signed. Directories follow the layout nbdkit and qemu use.
"""

import os
import shutil
import socket
import ssl
import struct
import subprocess
import tempfile
import unittest

import nbd

from weirtest import WEIR, Weir, admin_call, read_until_closed, recv_exact, run

NBDMAGIC = 0x4E42444D41474943
IHAVEOPT = 0x49484156454F5054
REPLY_MAGIC = 0x3E889045565A9
OPT_STARTTLS, OPT_GO, OPT_STRUCTURED_REPLY = 5, 7, 8
REP_ACK = 1
REP_ERR_POLICY = 0x80000002
REP_ERR_TLS_REQD = 0x80000005

CERTS = None  # a TemporaryDirectory made once for the module


def openssl(*args, cwd):
    run("openssl", *args, cwd=cwd)


def make_ca(dir, name):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-days", "30", "-subj", f"/CN={name}", "-keyout", f"{name}-key.pem", "-out", f"{name}-cert.pem",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=dir)


def make_leaf(dir, name, cn, san, usage, ca):
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN={cn}",
            "-keyout", f"{name}-key.pem", "-out", f"{name}.csr", cwd=dir)
    with open(os.path.join(dir, f"{name}.ext"), "w") as f:
        # qemu checks keyEncipherment on client certificates too.
        f.write("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                f"extendedKeyUsage={usage}\nsubjectAltName={san}\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}-cert.pem", "-CAkey", f"{ca}-key.pem",
            "-CAcreateserial", "-days", "30", "-extfile", f"{name}.ext", "-out", f"{name}-cert.pem", cwd=dir)


def setUpModule():
    global CERTS
    CERTS = tempfile.TemporaryDirectory(prefix="weir-tls-")
    root = CERTS.name
    make_ca(root, "ca")
    make_ca(root, "stranger")
    make_leaf(root, "server", "localhost", "DNS:localhost,IP:127.0.0.1", "serverAuth", "ca")
    make_leaf(root, "client", "client.test", "DNS:client.test", "clientAuth", "ca")
    make_leaf(root, "forged", "client.test", "DNS:client.test", "clientAuth", "stranger")
    layouts = {
        "server": {"ca-cert.pem": "ca-cert.pem", "server-cert.pem": "server-cert.pem",
                   "server-key.pem": "server-key.pem"},
        "client": {"ca-cert.pem": "ca-cert.pem", "client-cert.pem": "client-cert.pem",
                   "client-key.pem": "client-key.pem"},
        # Trusts the server, has no certificate of its own.
        "anonymous": {"ca-cert.pem": "ca-cert.pem"},
        "forged": {"ca-cert.pem": "ca-cert.pem", "client-cert.pem": "forged-cert.pem",
                   "client-key.pem": "forged-key.pem"},
    }
    for layout, files in layouts.items():
        os.mkdir(os.path.join(root, layout))
        for name, source in files.items():
            shutil.copy(os.path.join(root, source), os.path.join(root, layout, name))


def tearDownModule():
    CERTS.cleanup()


def certs(layout):
    return os.path.join(CERTS.name, layout)


class TlsCase(unittest.TestCase):
    def serve(self, *args):
        weir = Weir("--tls-certificates", certs("server"), *args, tcp=True).start()
        self.addCleanup(weir.__exit__)
        return weir

    def nbds(self, weir, export, layout):
        return f"nbds://{weir.tcp_addr}/{export}?tls-certificates={certs(layout)}"

    def libnbd(self, weir, export, layout=None):
        """A connected libnbd handle, over TLS with `layout`'s certificates if given."""
        h = nbd.NBD()
        if layout:
            h.set_tls(nbd.TLS_REQUIRE)
            h.set_tls_certificates(certs(layout))
        host, port = weir.tcp_addr.rsplit(":", 1)
        h.set_export_name(export)
        h.connect_tcp(host, port)
        return h

    def raw(self, weir):
        host, port = weir.tcp_addr.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=10)
        greeting = recv_exact(sock, 18)
        self.assertEqual(struct.unpack(">QQH", greeting)[:2], (NBDMAGIC, IHAVEOPT))
        sock.sendall(struct.pack(">I", 3))  # fixed newstyle, no zeroes
        return sock

    @staticmethod
    def option(kind, data=b""):
        return struct.pack(">QII", IHAVEOPT, kind, len(data)) + data

    @staticmethod
    def go_data(name):
        return struct.pack(">I", len(name)) + name + b"\0\0"

    def reply(self, sock):
        magic, option, kind, length = struct.unpack(">QIII", recv_exact(sock, 20))
        self.assertEqual(magic, REPLY_MAGIC)
        return option, kind, recv_exact(sock, length)


    def qemu_img(self, weir, export, layout, *cmd, check=True):
        creds = f"tls-creds-x509,id=tls0,dir={certs(layout)},endpoint=client"
        host, port = weir.tcp_addr.rsplit(":", 1)
        image = f"driver=nbd,host={host},port={port},export={export},tls-creds=tls0"
        return run("qemu-img", *cmd[:-1], "--object", creds, "--image-opts", image, *cmd[-1:], check=check)


class RequiredTls(TlsCase):
    def test_every_client_reaches_a_tls_export_with_a_certificate(self):
        weir = self.serve("--export", "d=mem:64M", "--tls", "require", "--tls-verify-peer")
        info = run("nbdinfo", self.nbds(weir, "d", "client")).stdout
        self.assertIn("with TLS", info)
        with tempfile.TemporaryDirectory() as tmp:
            source = os.path.join(tmp, "source.img")
            with open(source, "wb") as f:
                f.write(os.urandom(24 << 20))
            run("nbdcopy", source, self.nbds(weir, "d", "client"))
            back = os.path.join(tmp, "back.img")
            run("nbdcopy", self.nbds(weir, "d", "client"), back)
            through_qemu = os.path.join(tmp, "qemu.img")
            self.qemu_img(weir, "d", "client", "convert", "-O", "raw", through_qemu)
            with open(source, "rb") as f:
                written = f.read()
            for copy in [back, through_qemu]:
                with open(copy, "rb") as f:
                    self.assertEqual(f.read(24 << 20), written, copy)
        h = self.libnbd(weir, "d", "client")
        self.assertTrue(h.get_tls_negotiated())
        h.pwrite(b"\xab" * 65536, 1 << 20)
        h.flush()
        self.assertEqual(h.pread(65536, 1 << 20), b"\xab" * 65536)
        h.shutdown()

    def test_clients_without_a_signed_certificate_are_refused(self):
        weir = self.serve("--export", "d=mem:16M", "--tls", "require", "--tls-verify-peer")
        for layout in ["anonymous", "forged"]:
            with self.subTest(layout=layout):
                self.assertNotEqual(run("nbdinfo", self.nbds(weir, "d", layout), check=False).returncode, 0)
                with tempfile.TemporaryDirectory() as tmp:
                    out = os.path.join(tmp, "out.img")
                    copy = run("nbdcopy", self.nbds(weir, "d", layout), out, check=False)
                    self.assertNotEqual(copy.returncode, 0)
                with self.assertRaises(nbd.Error):
                    self.libnbd(weir, "d", layout)
        # qemu checks its own certificate against its CA first, so a forged
        # one never leaves it; without one it asks and is refused.
        qemu = self.qemu_img(weir, "d", "anonymous", "info", check=False)
        self.assertNotEqual(qemu.returncode, 0, qemu.stdout)
        self.assertIn("peer sent no certificates", weir.logs())
        self.assertEqual(run("nbdinfo", "--size", self.nbds(weir, "d", "client")).stdout.strip(), str(16 << 20))

    def test_plaintext_clients_get_tls_required_for_every_option(self):
        weir = self.serve("--export", "d=mem:16M", "--tls", "require")
        sock = self.raw(weir)
        sock.sendall(self.option(OPT_GO, self.go_data(b"d")) + self.option(OPT_STRUCTURED_REPLY))
        self.assertEqual(self.reply(sock)[:2], (OPT_GO, REP_ERR_TLS_REQD))
        self.assertEqual(self.reply(sock)[:2], (OPT_STRUCTURED_REPLY, REP_ERR_TLS_REQD))
        sock.close()
        plain = run("nbdinfo", f"nbd://{weir.tcp_addr}/d", check=False)
        self.assertNotEqual(plain.returncode, 0)
        self.assertIn("TLS is required", weir.logs())
        # Without --tls-verify-peer, any client that starts TLS is served.
        self.assertIn("with TLS", run("nbdinfo", self.nbds(weir, "d", "anonymous")).stdout)

    def test_plaintext_sent_behind_starttls_closes_the_connection(self):
        weir = self.serve("--export", "d=mem:16M", "--tls", "require")
        sock = self.raw(weir)
        # A man in the middle appends a plaintext option to STARTTLS.
        sock.sendall(self.option(OPT_STARTTLS) + self.option(OPT_STRUCTURED_REPLY))
        self.assertEqual(self.reply(sock)[:2], (OPT_STARTTLS, REP_ACK))
        read_until_closed(sock)
        sock = self.raw(weir)
        sock.sendall(self.option(OPT_STARTTLS))
        self.assertEqual(self.reply(sock)[:2], (OPT_STARTTLS, REP_ACK))
        sock.sendall(b"this is not a TLS ClientHello" * 10)
        read_until_closed(sock)
        self.assertIn("plaintext bytes after NBD_OPT_STARTTLS", weir.logs())
        self.assertIn("TLS handshake failed", weir.logs())
        self.assertIn("with TLS", run("nbdinfo", self.nbds(weir, "d", "anonymous")).stdout)

    def test_a_server_without_its_certificates_does_not_start(self):
        empty = tempfile.TemporaryDirectory()
        self.addCleanup(empty.cleanup)
        result = run(os.environ.get("WEIR_BIN", "weir"), "serve", "--listen", "127.0.0.1:0", "--admin", "none",
                     "--export", "d=mem:1M", "--tls", "on", "--tls-certificates", empty.name, check=False, timeout=30)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("server-cert.pem", result.stderr)


class SelectiveTlsAndAccess(TlsCase):
    def test_tls_only_exports_are_hidden_and_refused_in_plaintext(self):
        weir = self.serve("--export", "open=mem:16M", "--export", "secret=mem:16M,tls-only", "--tls", "on")
        listed = run("nbdinfo", "--list", f"nbd://{weir.tcp_addr}").stdout
        self.assertIn('export="open"', listed)
        self.assertNotIn("secret", listed)
        self.assertNotEqual(run("nbdinfo", f"nbd://{weir.tcp_addr}/secret", check=False).returncode, 0)
        sock = self.raw(weir)
        sock.sendall(self.option(OPT_GO, self.go_data(b"secret")))
        self.assertEqual(self.reply(sock)[:2], (OPT_GO, REP_ERR_TLS_REQD))
        sock.close()
        self.assertIn("without TLS", run("nbdinfo", f"nbd://{weir.tcp_addr}/open").stdout)
        self.assertIn("with TLS", run("nbdinfo", self.nbds(weir, "secret", "anonymous")).stdout)
        listed = run("nbdinfo", "--list", f"nbds://{weir.tcp_addr}?tls-certificates={certs('anonymous')}").stdout
        self.assertIn('export="secret"', listed)

    def test_allow_lists_and_read_only_clients(self):
        weir = self.serve(
            "--tls", "on", "--tls-verify-peer",
            "--export", "mine=mem:16M,allow=cert:client.test",
            "--export", "theirs=mem:16M,allow=cert:someone.else",
            "--export", "lan=mem:16M,allow=10.0.0.0/8",
            "--export", "local=mem:16M,allow=127.0.0.1",
            "--export", "shared=mem:16M,readonly-for=cert:client.test",
        )
        h = self.libnbd(weir, "mine", "client")
        h.pwrite(b"x" * 4096, 0)
        h.shutdown()
        for export, layout in [("mine", None), ("theirs", "client"), ("lan", None), ("lan", "client")]:
            with self.subTest(export=export, layout=layout):
                with self.assertRaises(nbd.Error) as refused:
                    self.libnbd(weir, export, layout)
                self.assertIn("policy", str(refused.exception))
        sock = self.raw(weir)
        sock.sendall(self.option(OPT_GO, self.go_data(b"theirs")))
        option, kind, message = self.reply(sock)
        self.assertEqual((option, kind), (OPT_GO, REP_ERR_POLICY))
        self.assertIn(b"127.0.0.1", message)
        sock.close()
        self.assertIn('refused export "theirs"', weir.logs())
        self.libnbd(weir, "local").shutdown()
        # Read-only for the certificate's holder, read-write for others.
        h = self.libnbd(weir, "shared", "client")
        self.assertTrue(h.is_read_only())
        with self.assertRaises(nbd.Error):
            h.pwrite(b"y" * 4096, 0)
        h.shutdown()
        h = self.libnbd(weir, "shared")
        self.assertFalse(h.is_read_only())
        h.pwrite(b"y" * 4096, 0)
        h.shutdown()

    def test_settings_that_admit_no_one_are_refused_at_start(self):
        weir_bin = os.environ.get("WEIR_BIN", "weir")
        for args, says in [
            (["--export", "d=mem:1M,tls-only"], "TLS is off"),
            (["--tls", "on", "--export", "d=mem:1M,allow=cert:x"], "--tls-verify-peer"),
            (["--export", "d=mem:1M,allow=vm1"], "cert:NAME"),
        ]:
            with self.subTest(args=args):
                result = run(weir_bin, "serve", "--listen", "127.0.0.1:0", "--admin", "none",
                             "--tls-certificates", certs("server"), *args, check=False, timeout=30)
                self.assertNotEqual(result.returncode, 0)
                self.assertIn(says, result.stderr)


class AdminOverTls(TlsCase):
    def test_the_admin_endpoint_on_tcp_speaks_only_tls_and_needs_the_token(self):
        weir = self.serve("--tls", "on", "--admin", "127.0.0.1:0")
        data = os.path.join(weir.dir, "weir-data")
        with open(os.path.join(data, "admin.addr")) as f:
            lines = f.read().split()
        self.assertTrue(lines[0].startswith("unix:") and lines[1].startswith("https://127.0.0.1:"), lines)
        host, port = lines[1].removeprefix("https://").rsplit(":", 1)
        ca = os.path.join(certs("client"), "ca-cert.pem")
        status, body = admin_call(data, "GET", "/metrics", tcp=True, cafile=ca)
        self.assertEqual(status, 200)
        self.assertIn("weir_", body)
        self.assertEqual(admin_call(data, "GET", "/metrics", tcp=True, cafile=ca, token=False)[0], 401)
        # A client that does not trust the server's CA never gets as far as HTTP.
        with self.assertRaises(ssl.SSLError):
            admin_call(data, "GET", "/metrics", tcp=True, cafile=os.path.join(CERTS.name, "stranger-cert.pem"))
        # Plaintext HTTP to the TLS port gets no HTTP answer.
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            answer = b""
            try:
                while chunk := sock.recv(4096):
                    answer += chunk
            except ConnectionResetError:
                pass
            self.assertFalse(answer.startswith(b"HTTP/"), answer[:40])
        # A client that connects and never starts the handshake is closed.
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            self.assertEqual(sock.recv(1), b"")
        # The CLI keeps using the Unix socket.
        self.assertIn("demo", run(WEIR, "pool", "status", "--data-dir", data).stdout)
        self.assertTrue(weir.alive())


if __name__ == "__main__":
    unittest.main()
