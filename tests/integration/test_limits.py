"""Floods and crowds from raw sockets: what weir holds stays bounded, and
the clients that behave stay served.

Flooders connect from other loopback addresses (127.0.0.2 and up), so the
per-address limits treat them as other hosts than the client under test.
"""

import os
import socket
import struct
import tempfile
import threading
import time
import unittest

import nbd

from weirtest import Weir, recv_exact, sparse_file

MIB = 1 << 20
IHAVEOPT = 0x49484156454F5054
REQUEST_MAGIC = 0x25609513
CMD_READ, CMD_WRITE = 0, 1


def status_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def reset_peak_rss(pid):
    # Writing 5 to clear_refs resets VmHWM to the current RSS.
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def connect_from(source, weir, export=b"vol"):
    """A raw connection from `source`, through option haggling to `export`."""
    host, port = weir.tcp_addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=20, source_address=(source, 0))
    recv_exact(sock, 18)
    sock.sendall(struct.pack(">I", 3))
    data = struct.pack(">I", len(export)) + export + b"\0\0"
    sock.sendall(struct.pack(">QII", IHAVEOPT, 7, len(data)) + data)
    while True:
        _, _, kind, length = struct.unpack(">QIII", recv_exact(sock, 20))
        recv_exact(sock, length)
        if kind == 1:
            return sock
        assert kind == 3, hex(kind)


def served_quickly(test, weir, seconds=15):
    """A well-behaved client on 127.0.0.1 writes, flushes and reads back."""
    started = time.monotonic()
    h = nbd.NBD()
    host, port = weir.tcp_addr.rsplit(":", 1)
    h.set_export_name("vol")
    h.connect_tcp(host, port)
    data = os.urandom(MIB)
    h.pwrite(data, 8 * MIB)
    h.flush()
    test.assertEqual(h.pread(MIB, 8 * MIB), data)
    h.shutdown()
    test.assertLess(time.monotonic() - started, seconds)


class Limits(unittest.TestCase):
    def serve(self, tmp, *args):
        backing = sparse_file(os.path.join(tmp, "vol.img"), 64 * MIB)
        weir = Weir("--export", f"vol={backing}", "--cache", "writethrough", *args, tcp=True).start()
        self.addCleanup(weir.__exit__)
        served_quickly(self, weir)
        return weir

    def flood(self, weir, addresses, per_address, reads_each):
        """Connections that ask for 32 MiB reads and never read a reply."""
        socks = []
        for address in addresses:
            for _ in range(per_address):
                sock = connect_from(address, weir)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                for handle in range(reads_each):
                    sock.sendall(struct.pack(">IHHQQI", REQUEST_MAGIC, 0, CMD_READ, handle, 0, 32 * MIB))
                socks.append(sock)
        return socks

    def peak_growth_mib(self, weir, socks, settle_s=4):
        """Peak RSS growth while `socks` hold their requests, in MiB."""
        time.sleep(settle_s)
        peak = status_kib(weir.proc.pid, "VmHWM") // 1024
        for sock in socks:
            sock.close()
        return peak

    def test_a_flood_of_large_reads_stays_within_the_in_flight_bound(self):
        """32 connections from 4 addresses each ask for 4 reads of 32 MiB
        and read nothing: 4 GiB asked, 2 GiB within the connections' own
        budgets. With --max-in-flight 256M the server holds at most that,
        and a client from another address is served meanwhile."""
        addresses = [f"127.0.0.{i}" for i in range(2, 6)]
        results = {}
        for limit in ["256M", "8G"]:
            with tempfile.TemporaryDirectory() as tmp:
                weir = self.serve(tmp, "--max-in-flight", limit)
                reset_peak_rss(weir.proc.pid)
                baseline = status_kib(weir.proc.pid, "VmRSS") // 1024
                socks = self.flood(weir, addresses, per_address=8, reads_each=4)
                if limit == "256M":
                    served_quickly(self, weir)
                results[limit] = self.peak_growth_mib(weir, socks) - baseline
                self.assertTrue(weir.alive())
                self.assertNotIn("panicked", weir.logs())
        # The control shows the flood is real: unbounded, it holds > 1 GiB.
        self.assertGreater(results["8G"], 1024, results)
        self.assertLess(results["256M"], 256 + 96, results)

    def test_a_thousand_idle_connections_leave_others_served(self):
        """1,000 connections from 4 addresses finish the handshake and sit
        idle: every one is kept (kernel clients idle for days), they cost
        little memory, and a new client is served at once."""
        with tempfile.TemporaryDirectory() as tmp:
            weir = self.serve(tmp)
            baseline = status_kib(weir.proc.pid, "VmRSS") // 1024
            socks = []
            for address in [f"127.0.0.{i}" for i in range(2, 6)]:
                socks += [connect_from(address, weir) for _ in range(250)]
            time.sleep(1)
            growth = status_kib(weir.proc.pid, "VmRSS") // 1024 - baseline
            threads = status_kib(weir.proc.pid, "Threads")
            served_quickly(self, weir)
            # Every idle connection still answers.
            for handle, sock in enumerate(socks[::50]):
                sock.sendall(struct.pack(">IHHQQI", REQUEST_MAGIC, 0, CMD_READ, handle, 0, 4096))
                magic, error, got = struct.unpack(">IIQ", recv_exact(sock, 16))
                self.assertEqual((magic, error, got), (0x67446698, 0, handle))
                recv_exact(sock, 4096)
            for sock in socks:
                sock.close()
            self.assertGreaterEqual(threads, 1000)
            self.assertLess(growth, 300, f"{growth} MiB for 1,000 idle connections")
            self.assertNotIn("refusing connection", weir.logs())

    def test_writes_that_stall_mid_payload_hold_only_their_budget(self):
        """16 connections from 2 addresses announce 32 MiB writes and stop
        halfway through the payload. Each holds the budget of the one
        write it started, the rest wait before their payload is read, and
        a client from another address is served meanwhile."""
        with tempfile.TemporaryDirectory() as tmp:
            weir = self.serve(tmp, "--max-in-flight", "256M")
            reset_peak_rss(weir.proc.pid)
            baseline = status_kib(weir.proc.pid, "VmRSS") // 1024
            socks = []

            def stall(sock, handle):
                try:
                    sock.sendall(struct.pack(">IHHQQI", REQUEST_MAGIC, 0, CMD_WRITE, handle, 0, 32 * MIB))
                    sock.sendall(bytes(16 * MIB))
                except OSError:
                    pass  # the server does not read the payload of a write waiting for budget

            senders = []
            for address in ["127.0.0.2", "127.0.0.3"]:
                for handle in range(8):
                    sock = connect_from(address, weir)
                    sock.settimeout(5)
                    socks.append(sock)
                    senders.append(threading.Thread(target=stall, args=(sock, handle)))
            for sender in senders:
                sender.start()
            for sender in senders:
                sender.join()
            served_quickly(self, weir)
            growth = self.peak_growth_mib(weir, socks, settle_s=1) - baseline
            self.assertLess(growth, 256 + 96)
            time.sleep(0.5)
            self.assertTrue(weir.alive())
            self.assertIn("mid-write payload", weir.logs())


if __name__ == "__main__":
    unittest.main()
