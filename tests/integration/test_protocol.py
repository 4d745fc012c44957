"""libnbd (python3 nbd) exercising every command and flag, plus raw-socket
malformed input, durability across kill -9, graceful shutdown and config errors."""

import errno
import os
import random
import signal
import socket
import stat
import struct
import subprocess
import tempfile
import threading
import time
import unittest

import nbd

import modelcheck
from weirtest import WEIR, Weir, raw_connection, read_until_closed, recv_exact, run, sparse_file

MIB = 1 << 20
NBDMAGIC = 0x4E42444D41474943
IHAVEOPT = 0x49484156454F5054
REPLY_MAGIC = 0x3E889045565A9


def connect(uri, meta=True, strict=True):
    h = nbd.NBD()
    if meta:
        h.add_meta_context("base:allocation")
    if not strict:
        h.set_strict_mode(0)
    h.connect_uri(uri)
    return h


def errnum(call):
    try:
        call()
    except nbd.Error as err:
        return err.errnum
    raise AssertionError("expected the server to fail the request")


def extents_of(h, length, offset):
    found = []

    def callback(context, at, entries, err):
        found.extend(zip(entries[0::2], entries[1::2]))
        return 0

    h.block_status(length, offset, callback)
    return found


class Commands(unittest.TestCase):
    def test_every_command_and_flag(self):
        with Weir("--export", "vol=mem:64M") as weir:
            h = connect(weir.uri("vol"))
            self.assertTrue(h.can_multi_conn() and h.can_fua() and h.can_trim() and h.can_zero())
            self.assertTrue(h.can_fast_zero() and h.can_cache() and h.can_flush())
            self.assertEqual(h.get_size(), 64 * MIB)
            data = os.urandom(MIB)
            h.pwrite(data, 0)
            h.pwrite(data, MIB, nbd.CMD_FLAG_FUA)
            self.assertEqual(h.pread(MIB, 0), data)
            self.assertEqual(h.pread(MIB, MIB), data)
            self.assertEqual(h.pread(1000, 12345), data[12345:13345])
            h.flush()
            h.cache(MIB, 0)
            h.trim(MIB, 0, nbd.CMD_FLAG_FUA)
            self.assertEqual(h.pread(MIB, 0), bytes(MIB))
            h.zero(4096, MIB, nbd.CMD_FLAG_NO_HOLE)
            h.zero(4096, MIB + 8192, nbd.CMD_FLAG_FAST_ZERO | nbd.CMD_FLAG_FUA)
            self.assertEqual(h.pread(16384, MIB), bytes(4096) + data[4096:8192] + bytes(4096) + data[12288:16384])
            extents = extents_of(h, 4 * MIB, 0)
            self.assertEqual(extents[0], (MIB, 3), extents)  # trimmed: hole + zero
            self.assertEqual(sum(length for length, _ in extents), 4 * MIB)
            one = []
            h.block_status(4 * MIB, 0, lambda c, o, e, err: one.extend(e), nbd.CMD_FLAG_REQ_ONE)
            self.assertEqual(len(one), 2)
            h.shutdown()
            self.assertEqual(weir.stop(), 0)

    def test_structured_replies_off_still_reads(self):
        with Weir("--export", "vol=mem:8M") as weir:
            h = nbd.NBD()
            h.set_request_structured_replies(False)
            h.connect_uri(weir.uri("vol"))
            self.assertFalse(h.get_structured_replies_negotiated())
            h.pwrite(b"x" * 4096, 4096)
            self.assertEqual(h.pread(8192, 0), bytes(4096) + b"x" * 4096)
            h.shutdown()

    def test_error_cases(self):
        with Weir("--export", "vol=mem:8M", "--export", "ro=mem:8M,readonly") as weir:
            h = connect(weir.uri("vol"), strict=False)
            self.assertEqual(errnum(lambda: h.pread(4096, 8 * MIB - 100)), errno.EINVAL)
            self.assertEqual(errnum(lambda: h.pread(4096, 2**63)), errno.EINVAL)
            self.assertEqual(errnum(lambda: h.pwrite(b"x" * 4096, 8 * MIB)), errno.ENOSPC)
            self.assertIn(errnum(lambda: h.pread(33 * MIB, 0)), (errno.EINVAL, errno.EOVERFLOW))
            self.assertEqual(h.pread(4096, 0), bytes(4096), "the connection survives the errors")
            h.shutdown()
            r = connect(weir.uri("ro"), strict=False)
            self.assertTrue(r.is_read_only())
            self.assertEqual(errnum(lambda: r.pwrite(b"x" * 512, 0)), errno.EPERM)
            self.assertEqual(errnum(lambda: r.trim(512, 0)), errno.EPERM)
            self.assertEqual(errnum(lambda: r.zero(512, 0)), errno.EPERM)
            r.flush()
            r.shutdown()

    def test_multi_conn_disjoint_writers(self):
        with Weir("--export", "vol=mem:64M") as weir:
            chunk = 4 * MIB
            payloads = [os.urandom(chunk) for _ in range(4)]
            handles = [connect(weir.uri("vol")) for _ in range(4)]
            self.assertTrue(all(h.can_multi_conn() for h in handles))

            def writer(i):
                h = handles[i]
                for piece in range(0, chunk, 256 * 1024):
                    h.pwrite(payloads[i][piece:piece + 256 * 1024], i * chunk + piece)

            threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            handles[0].flush()
            for i in range(4):
                # Each connection reads what another wrote.
                self.assertEqual(handles[(i + 1) % 4].pread(chunk, i * chunk), payloads[i])
            for h in handles:
                h.shutdown()

    def test_random_unaligned_concurrent_io_matches_a_model(self):
        """Reads, writes, zeroes and trims at random on three connections,
        up to 16 in flight, unaligned and crowded into a small window
        (requests in flight together often share a block), on memory
        exports written through and back and an O_DIRECT file export; after a restart the file holds what was
        flushed, and the same goes on with the thread-pool I/O engine."""
        def exercise(weir, name, model, seed):
            # Three connections, so that requests sharing a block also
            # arrive on different connections (and different threads).
            handles = [connect(weir.uri(name)) for _ in range(3)]
            counts = modelcheck.run_random_io(handles, model, ops=3000, seed=seed)
            self.assertGreater(counts.get("read", 0), 500, counts)
            self.assertGreater(counts.get("write", 0), 500, counts)
            self.assertGreater(counts.get("block shared with a write in flight", 0), 100, counts)
            handles[0].flush()
            modelcheck.check_whole(handles[1], model, name)
            for h in handles:
                h.shutdown()

        with tempfile.TemporaryDirectory() as tmp:
            backing = sparse_file(os.path.join(tmp, "vol.img"), 32 * MIB)
            models = {"mem": modelcheck.Model(32 * MIB, 2 * MIB),
                      "cached": modelcheck.Model(32 * MIB, 2 * MIB),
                      "file": modelcheck.Model(32 * MIB, 2 * MIB)}
            # Memory exports write through by default; "cached" goes
            # through the write-back cache, as the file export does.
            with Weir("--export", "mem=mem:32M", "--export", "cached=mem:32M,cache=writeback",
                      "--export", f"file={backing}") as weir:
                for seed, name in enumerate(models):
                    exercise(weir, name, models[name], seed)
                self.assertEqual(weir.stop(), 0)
                self.assertNotIn("panicked", weir.logs())
            with Weir("--export", f"file={backing}", "--io-engine", "threads") as weir:
                h = connect(weir.uri("file"))
                modelcheck.check_whole(h, models["file"], "file after a restart")
                h.shutdown()
                exercise(weir, "file", models["file"], seed=5)
                self.assertEqual(weir.stop(), 0)

    def test_many_requests_in_flight_are_answered_out_of_order(self):
        with Weir("--export", "vol=mem:64M") as weir:
            h = connect(weir.uri("vol"))
            h.pwrite(os.urandom(16 * MIB), 0)
            bufs, cookies = [], []
            for i in range(64):
                buf = nbd.Buffer(256 * 1024)
                cookies.append(h.aio_pread(buf, (i * 256 * 1024) % (16 * MIB)))
                bufs.append(buf)
            while h.aio_in_flight() > 0:
                h.poll(-1)
            for cookie in cookies:
                self.assertTrue(h.aio_command_completed(cookie))
            h.shutdown()


class RawClient:
    """Speaks the protocol byte by byte, for cases libnbd would refuse to send."""

    def handshake_to_options(self, sock, client_flags=1):
        greeting = recv_exact(sock, 18)
        self.assertEqual(struct.unpack(">QQH", greeting)[:2], (NBDMAGIC, IHAVEOPT))
        sock.sendall(struct.pack(">I", client_flags))

    def assert_closed(self, sock):
        read_until_closed(sock)

    def option_reply(self, sock):
        magic, option, kind, length = struct.unpack(">QIII", recv_exact(sock, 20))
        self.assertEqual(magic, REPLY_MAGIC)
        return option, kind, recv_exact(sock, length)

    def go(self, sock, name=b"vol"):
        sock.sendall(struct.pack(">QII", IHAVEOPT, 7, 4 + len(name) + 2) + struct.pack(">I", len(name)) + name + b"\0\0")
        while True:
            option, kind, _ = self.option_reply(sock)
            if kind == 1:
                return
            self.assertEqual(kind, 3)



class MalformedInput(RawClient, unittest.TestCase):
    def test_random_request_streams_never_hurt_the_server(self):
        """150 connections each send a burst of random requests (edge
        offsets and lengths, unknown kinds and flags, payloads cut short,
        junk between headers), then hang up at once or read what comes
        back. The server stays up, answers in its own format while a
        stream is in step, and another client's data and connection are
        untouched."""
        rng = random.Random(2026)
        with Weir("--export", "vol=mem:16M", "--export", "scratch=mem:16M") as weir:
            good = connect(weir.uri("vol"))
            pattern = os.urandom(MIB)
            good.pwrite(pattern, 3 * MIB)
            for _ in range(150):
                s = raw_connection(weir.socket)
                s.settimeout(5)
                self.handshake_to_options(s)
                self.go(s, b"scratch")
                stream = b""
                for handle in range(rng.randrange(1, 20)):
                    kind = rng.choice([0, 0, 1, 1, 2, 3, 4, 5, 6, 7, 9, 0xffff])
                    flags = rng.choice([0, 0, 1, 2, 4, 8, 16, 32, 0xffff])
                    length = rng.choice([0, 1, 4096, 65537, 32 * MIB, 32 * MIB + 1, 0xffffffff])
                    offset = rng.choice([0, 4095, 16 * MIB - 4096, 16 * MIB, 2 ** 63, 2 ** 64 - 1])
                    stream += struct.pack(">IHHQQI", 0x25609513, flags, kind, handle, offset, length)
                    if kind == 1 and length <= 65537:
                        stream += os.urandom(length if rng.random() < 0.7 else rng.randrange(length + 1))
                    if rng.random() < 0.1:
                        stream += os.urandom(rng.randrange(1, 40))
                try:
                    s.sendall(stream)
                    if rng.random() < 0.5:
                        s.shutdown(socket.SHUT_WR)
                        first = s.recv(16)
                        if len(first) >= 4:
                            self.assertEqual(struct.unpack(">I", first[:4])[0], 0x67446698)
                        while s.recv(65536):
                            pass
                except (ConnectionError, socket.timeout):
                    pass
                s.close()
            self.assertTrue(weir.alive())
            self.assertEqual(good.pread(MIB, 3 * MIB), pattern)
            other = connect(weir.uri("vol"))
            self.assertEqual(other.pread(MIB, 3 * MIB), pattern)
            other.shutdown()
            good.shutdown()
            self.assertEqual(weir.stop(), 0)
            self.assertNotIn("panicked", weir.logs())

    def test_one_address_cannot_take_every_connection_slot(self):
        with Weir("--export", "vol=mem:16M", tcp=True) as weir:
            host, port = weir.tcp_addr.rsplit(":", 1)
            flood = []
            try:
                # 300 idle connections from 127.0.0.2: the first 256 are
                # served (greeted), the rest closed at once.
                for _ in range(300):
                    s = socket.socket()
                    s.bind(("127.0.0.2", 0))
                    s.connect((host, int(port)))
                    flood.append(s)
                greeted = refused = 0
                for s in flood:
                    s.settimeout(10)
                    try:
                        got = s.recv(18)
                    except ConnectionResetError:
                        got = b""
                    if got.startswith(b"NBDMAGIC"):
                        greeted += 1
                    else:
                        refused += 1
                self.assertEqual((greeted, refused), (256, 44))
                # Another address is served as before, over TCP and the socket.
                h = connect(weir.tcp_uri("vol"))
                h.pwrite(b"x" * 4096, 0)
                self.assertEqual(bytes(connect(weir.uri("vol")).pread(4096, 0)), b"x" * 4096)
                h.shutdown()
            finally:
                for s in flood:
                    s.close()
            self.assertIn("already open from 127.0.0.2", weir.logs())

    def test_bad_input_never_hurts_other_clients(self):
        with Weir("--export", "vol=mem:16M") as weir:
            good = connect(weir.uri("vol"))
            good.pwrite(b"k" * 4096, 0)

            # 1. Garbage instead of client flags.
            s = raw_connection(weir.socket)
            self.handshake_to_options(s, client_flags=0xFFFFFFFF)
            self.assert_closed(s)

            # 2. Wrong option magic.
            s = raw_connection(weir.socket)
            self.handshake_to_options(s)
            s.sendall(b"NOTMAGIC" + struct.pack(">II", 3, 0))
            self.assert_closed(s)

            # 3. An option whose length lies about its contents, then an unknown option.
            s = raw_connection(weir.socket)
            self.handshake_to_options(s)
            s.sendall(struct.pack(">QII", IHAVEOPT, 7, 6) + struct.pack(">I", 500) + b"\0\0")
            self.assertEqual(self.option_reply(s)[1], 0x80000003)  # NBD_REP_ERR_INVALID
            s.sendall(struct.pack(">QII", IHAVEOPT, 0x77, 3) + b"abc")
            self.assertEqual(self.option_reply(s)[1], 0x80000001)  # NBD_REP_ERR_UNSUP
            # An option announcing 2 GiB is refused at its header, unread.
            s.sendall(struct.pack(">QII", IHAVEOPT, 3, 2**31 - 1))
            self.assertEqual(self.option_reply(s)[1], 0x80000009)  # NBD_REP_ERR_TOO_BIG
            self.assert_closed(s)

            # 4. Transmission: unknown command, unknown flag, out of range, then bad magic.
            s = raw_connection(weir.socket)
            self.handshake_to_options(s)
            self.go(s)
            def request(flags, kind, handle, offset, length, payload=b""):
                s.sendall(struct.pack(">IHHQQI", 0x25609513, flags, kind, handle, offset, length) + payload)
                magic, error, got = struct.unpack(">IIQ", recv_exact(s, 16))
                self.assertEqual((magic, got), (0x67446698, handle))
                return error
            self.assertEqual(request(0, 42, 1, 0, 512), errno.EINVAL)
            self.assertEqual(request(1 << 12, 0, 2, 0, 512), errno.EINVAL)
            self.assertEqual(request(0, 1, 4, 16 * MIB, 512, bytes(512)), errno.ENOSPC)
            # Offsets whose end overflows 64 bits are out of range, not wrapped.
            self.assertEqual(request(0, 0, 6, 2**64 - 512, 1024), errno.EINVAL)
            self.assertEqual(request(0, 1, 7, 2**64 - 512, 1024, bytes(1024)), errno.ENOSPC)
            self.assertEqual(request(0, 3, 5, 0, 0), 0)  # flush still works after all that
            s.sendall(b"\xde\xad\xbe\xef" + bytes(24))
            self.assert_closed(s)

            # A write header announcing 4 GiB - 1 closes the connection at once,
            # without the server reading (or the client sending) the payload.
            s = raw_connection(weir.socket)
            self.handshake_to_options(s)
            self.go(s)
            s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 1, 3, 0, 2**32 - 1))
            self.assert_closed(s)

            # 5. A client that vanishes mid-request and one that vanishes with replies pending.
            s = raw_connection(weir.socket)
            self.handshake_to_options(s)
            self.go(s)
            s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 1, 9, 0, 65536) + b"x" * 1000)
            s.close()
            s = raw_connection(weir.socket)
            self.handshake_to_options(s)
            self.go(s)
            for i in range(32):
                s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 0, i, 0, MIB))
            s.close()

            # 6. A client that stops mid-handshake.
            s = raw_connection(weir.socket)
            recv_exact(s, 18)
            s.close()

            time.sleep(0.2)
            self.assertTrue(weir.alive())
            self.assertEqual(good.pread(4096, 0), b"k" * 4096)
            self.assertEqual(bytes(connect(weir.uri("vol")).pread(4096, 0)), b"k" * 4096)
            good.shutdown()
            self.assertEqual(weir.stop(), 0)
            logs = weir.logs()
            for reason in ("unknown flags", "bad option magic", "bad request magic", "unknown command",
                           "larger than the maximum block size", "closed without reading it",
                           "more than 65536", "mid-write payload"):
                self.assertIn(reason, logs)
            self.assertNotIn("panicked", logs)


class Durability(RawClient, unittest.TestCase):
    def test_flushed_data_survives_kill_9(self):
        with tempfile.TemporaryDirectory() as tmp:
            backing = sparse_file(os.path.join(tmp, "vol.img"), 64 * MIB)
            data = os.urandom(8 * MIB)
            fua = os.urandom(MIB)
            with Weir("--export", f"vol={backing}") as weir:
                h = connect(weir.uri("vol"))
                h.pwrite(data, 0)
                h.flush()
                h.pwrite(fua, 16 * MIB, nbd.CMD_FLAG_FUA)
                weir.stop(signal.SIGKILL)
            with Weir("--export", f"vol={backing}") as weir:
                h = connect(weir.uri("vol"))
                self.assertEqual(h.pread(8 * MIB, 0), data)
                self.assertEqual(h.pread(MIB, 16 * MIB), fua)
                h.shutdown()

    def test_sigterm_answers_received_requests_then_exits_zero(self):
        with tempfile.TemporaryDirectory() as tmp:
            backing = sparse_file(os.path.join(tmp, "vol.img"), 64 * MIB)
            with Weir("--export", f"vol={backing}") as weir:
                s = raw_connection(weir.socket)
                self.handshake_to_options(s)
                self.go(s)
                payload = os.urandom(256 * 1024)
                for i in range(32):
                    s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 1, i, i * len(payload), len(payload)) + payload)
                weir.proc.send_signal(signal.SIGTERM)
                answered = set()
                for _ in range(32):
                    magic, error, handle = struct.unpack(">IIQ", recv_exact(s, 16))
                    self.assertEqual((magic, error), (0x67446698, 0))
                    answered.add(handle)
                self.assertEqual(answered, set(range(32)))
                s.close()
                self.assertEqual(weir.stop(), 0)
                self.assertIn("all volumes flushed", weir.logs())
            with open(backing, "rb") as f:
                f.seek(31 * len(payload))
                self.assertEqual(f.read(len(payload)), payload)

    def test_a_client_that_stops_reading_cannot_hold_up_shutdown(self):
        """A client asks for 64 MiB and never reads a byte of it: after the
        grace its connection is closed, the volume is still flushed (a
        write acknowledged to another client survives) and weir exits 0."""
        with tempfile.TemporaryDirectory() as tmp:
            backing = sparse_file(os.path.join(tmp, "vol.img"), 128 * MIB)
            with Weir("--export", f"vol={backing}", "--shutdown-grace-seconds", "2") as weir:
                stalled = raw_connection(weir.socket)
                self.handshake_to_options(stalled)
                self.go(stalled)
                for i in range(64):
                    stalled.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 0, i, i * MIB, MIB))
                good = connect(weir.uri("vol"))
                payload = os.urandom(MIB)
                good.pwrite(payload, 100 * MIB)
                good.shutdown()
                started = time.monotonic()
                code = weir.stop(timeout=30)
                took = time.monotonic() - started
                self.assertEqual(code, 0)
                self.assertGreaterEqual(took, 1.5, "the grace was given")
                self.assertLess(took, 15, "the stalled client did not hold shutdown up")
                logs = weir.logs()
                self.assertIn("still unfinished after 2s", logs)
                self.assertIn("all volumes flushed", logs)
                stalled.close()
            with open(backing, "rb") as f:
                f.seek(100 * MIB)
                self.assertEqual(f.read(MIB), payload)


class Startup(unittest.TestCase):
    def serve_fails(self, *args):
        result = subprocess.run([WEIR, "serve", "--listen", "none", "--socket", "/tmp/weir-never.sock", *args],
                                capture_output=True, text=True, timeout=30)
        self.assertNotEqual(result.returncode, 0)
        return result.stderr

    def test_bad_config_is_refused_with_the_key_named(self):
        with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
            f.write('[[export]]\nname = "a"\ndevice = "mem:1M"\nsize = 3\n')
            f.flush()
            self.assertIn("size", self.serve_fails("--config", f.name))

    def test_missing_backing_file_is_refused(self):
        err = self.serve_fails("--export", "a=/nonexistent/disk.img")
        self.assertIn("/nonexistent/disk.img", err)

    def test_mistakes_on_the_command_line_are_named_not_ignored(self):
        self.assertIn('unknown log level "foo"', self.serve_fails("--export", "a=mem:1M", "--log-level", "foo"))
        with tempfile.TemporaryDirectory(prefix="weir-cli-") as tmp:
            typo = os.path.join(tmp, "TYPO")
            for cmd in (["pool", "status"], ["volume", "list"]):
                result = subprocess.run([WEIR, *cmd, "--data-dir", typo], capture_output=True, text=True, timeout=30)
                self.assertNotEqual(result.returncode, 0, cmd)
                self.assertIn("does not exist: no pools are registered there", result.stderr)
                self.assertFalse(os.path.exists(typo), "a read-only command made the directory")
            # An --export named as a pool volume would hide one of them.
            data = os.path.join(tmp, "data")
            serve = [WEIR, "serve", "--listen", "none", "--socket", os.path.join(tmp, "w.sock"),
                     "--admin", "none", "--data-dir", data]
            with Weir("--data-dir", data, "--admin", "none") as w:
                self.assertEqual(w.stop(), 0)  # the demo pool, demo/default, now exists
            clash = subprocess.run([*serve, "--export", "demo/default=mem:1M"], capture_output=True, text=True,
                                   timeout=30)
            self.assertNotEqual(clash.returncode, 0)
            self.assertIn('export "demo/default" is both an --export and a pool volume', clash.stderr)
            # A socket alone serves only the socket: no TCP address is announced.
            proc = subprocess.Popen([WEIR, "serve", "--socket", os.path.join(tmp, "only.sock"), "--admin", "none",
                                     "--export", "a=mem:1M"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    text=True)
            try:
                line = proc.stdout.readline()
                self.assertIn("nbd+unix:///a?socket=", line)
                self.assertNotIn("nbd://", line)
            finally:
                proc.terminate()
                self.assertEqual(proc.wait(timeout=30), 0)

    def test_a_service_manager_passes_the_sockets_and_hears_ready_and_stopping(self):
        with tempfile.TemporaryDirectory(prefix="weir-activation-") as tmp:
            notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            notify.bind(os.path.join(tmp, "notify.sock"))
            notify.settimeout(60)
            tcp = socket.socket()
            tcp.bind(("127.0.0.1", 0))
            tcp.listen()
            unix_path = os.path.join(tmp, "nbd.sock")
            unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            unix.bind(unix_path)
            unix.listen()
            pid_path = os.path.join(tmp, "weir.pid")
            # As systemd hands them over: descriptors 3 and 4, LISTEN_PID the
            # server's own pid. The --socket flag would fail to bind: it must
            # not be used while sockets are passed.
            script = (f'exec 3<&{tcp.fileno()} 4<&{unix.fileno()}; export LISTEN_PID=$$ LISTEN_FDS=2; '
                      f'exec "$0" serve --export a=mem:1M --admin none --pid-file {pid_path} '
                      f'--socket {tmp}/no/such/dir.sock')
            env = dict(os.environ, NOTIFY_SOCKET=os.path.join(tmp, "notify.sock"))
            proc = subprocess.Popen(["sh", "-c", script, WEIR], pass_fds=(tcp.fileno(), unix.fileno()), env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                self.assertIn(b"READY=1", notify.recv(4096))
                with open(pid_path) as f:
                    self.assertEqual(int(f.read()), proc.pid)
                port = tcp.getsockname()[1]
                self.assertIn("export-size: 1048576", run("nbdinfo", f"nbd://127.0.0.1:{port}/a").stdout)
                self.assertIn("export-size: 1048576", run("nbdinfo", f"nbd+unix:///a?socket={unix_path}").stdout)
            finally:
                proc.terminate()
                _, err = proc.communicate(timeout=60)
            self.assertEqual(proc.returncode, 0, err)
            self.assertIn(b"STOPPING=1", notify.recv(4096))
            self.assertFalse(os.path.exists(pid_path), "the pid file is removed at exit")
            self.assertTrue(os.path.exists(unix_path), "an inherited socket file is the service manager's")
            for s in (notify, tcp, unix):
                s.close()

    def test_a_server_that_cannot_listen_closes_its_pools_and_exits(self):
        with tempfile.TemporaryDirectory() as tmp, socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            data = os.path.join(tmp, "data")
            refused = subprocess.run([WEIR, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", data],
                                     capture_output=True, text=True, timeout=60)
            self.assertNotEqual(refused.returncode, 0)
            self.assertIn(f"cannot listen on 127.0.0.1:{port}", refused.stderr)
            # The demo pool was opened and exported before the listener
            # failed; it was written back and closed, not left held.
            self.assertIn("cache written back", refused.stderr)
            self.assertNotIn("still held", refused.stderr)
            status = run(WEIR, "pool", "status", "demo", "--data-dir", data).stdout
            self.assertIn("state: ONLINE", status)

    def test_version_and_help(self):
        self.assertIn("weir", run(WEIR, "--version").stdout)
        self.assertIn("serve", run(WEIR, "help").stdout)

    def test_embedded_default_is_a_mirrored_demo_pool_created_then_reopened(self):
        with tempfile.TemporaryDirectory() as tmp:
            with Weir(workdir=tmp) as weir:
                h = connect(weir.uri("demo/default"))
                # Two sparse 1 GiB files, less the pool's labels and metadata.
                self.assertEqual(h.get_size(), 1020 << 20)
                h.pwrite(b"persist!" * 512, 0)
                h.flush()
                h.shutdown()
                # What weir creates is its owner's alone.
                self.assertEqual(stat.S_IMODE(os.stat(weir.socket).st_mode) & 0o077, 0)
                data = os.path.join(tmp, "weir-data")
                self.assertEqual(stat.S_IMODE(os.stat(data).st_mode), 0o700)
                for name in ("demo-0.img", "demo-1.img", "pools.toml", "admin.addr"):
                    self.assertEqual(stat.S_IMODE(os.stat(os.path.join(data, name)).st_mode), 0o600, name)
                self.assertEqual(weir.stop(), 0)
                # The pool closed as the server stopped: nothing held it.
                self.assertNotIn("still held", weir.logs())
            for name in ("demo-0.img", "demo-1.img", "pools.toml"):
                self.assertTrue(os.path.exists(os.path.join(data, name)), name)
            status = run(WEIR, "pool", "status", "demo", "--data-dir", data).stdout
            self.assertIn("state: ONLINE", status)
            with Weir(workdir=tmp) as weir:
                self.assertEqual(connect(weir.uri("")).pread(4096, 0), b"persist!" * 512)

    def test_a_data_directory_from_before_pools_keeps_its_default_file(self):
        with tempfile.TemporaryDirectory() as tmp:
            os.mkdir(os.path.join(tmp, "weir-data"))
            with open(os.path.join(tmp, "weir-data", "default.img"), "wb") as f:
                f.truncate(1 << 30)
            with Weir(workdir=tmp) as weir:
                self.assertEqual(connect(weir.uri("default")).get_size(), 1 << 30)
            self.assertFalse(os.path.exists(os.path.join(tmp, "weir-data", "pools.toml")))


if __name__ == "__main__":
    unittest.main()
