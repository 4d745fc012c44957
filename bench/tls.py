#!/usr/bin/python3
"""NBD over TLS against plaintext: weir, nbdkit and qemu-nbd, one run.

Every server is memory-backed and listens on loopback TCP; weir and nbdkit
serve plaintext and TLS clients on one port (--tls on), qemu-nbd needs one
instance per mode. The client is nbdcopy on one connection, reading to
null: or writing from a file in /dev/shm, at the request size and depth of
each job; nbdcopy's own TLS (GnuTLS) costs CPU on the same 2 cores. The
exports are filled first (a server sends no bytes for reads of holes). Each job
runs on every target once per round, in rotating order; the median round is
reported with the spread.
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WEIR = os.environ.get("WEIR_BIN", os.path.join(ROOT, "target/release/weir"))
SIZE = 512 << 20
JOBS = [  # name, direction, request bytes, requests in flight
    ("read-1m-qd8", "read", 1 << 20, 8),
    ("read-4k-qd32", "read", 4096, 32),
    ("read-4k-qd1", "read", 4096, 1),
    ("write-1m-qd8", "write", 1 << 20, 8),
    ("write-4k-qd32", "write", 4096, 32),
]


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certificates(root):
    """A CA and a server certificate for 127.0.0.1; `client/` holds the CA only."""
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
            "-subj", "/CN=bench CA", "-keyout", "ca-key.pem", "-out", "ca-cert.pem",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
            cwd=root)
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=localhost",
            "-keyout", "server-key.pem", "-out", "server.csr", cwd=root)
    with open(os.path.join(root, "server.ext"), "w") as f:
        f.write("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca-cert.pem", "-CAkey", "ca-key.pem", "-CAcreateserial",
            "-days", "2", "-extfile", "server.ext", "-out", "server-cert.pem", cwd=root)
    os.mkdir(os.path.join(root, "client"))
    shutil.copy(os.path.join(root, "ca-cert.pem"), os.path.join(root, "client", "ca-cert.pem"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, proc, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early: {shlex.join(proc.args)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def nbdcopy(direction, uri, source, request_bytes, depth):
    """Seconds for one whole copy of the export."""
    src, dst = (uri, "null:") if direction == "read" else (source, uri)
    cmd = ["nbdcopy", "--connections=1", f"--requests={depth}", f"--request-size={request_bytes}",
           "--no-extents", src, dst]
    started = time.monotonic()
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    return time.monotonic() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "tls"))
    args = parser.parse_args()
    # Made now, so that a run of many minutes is not lost at its last step.
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="weir-tls-bench-")
    certs = os.path.join(tmp, "certs")
    os.mkdir(certs)
    make_certificates(certs)
    client = os.path.join(certs, "client")
    source = "/dev/shm/weir-tls-bench-source.img"
    with open(source, "wb") as f:
        for _ in range(SIZE >> 20):
            f.write(os.urandom(1 << 20))
    backing = "/dev/shm/weir-tls-bench-qemu.img"
    procs, uris = [], {}
    try:
        def start(cmd, port):
            print(f"  {shlex.join(cmd)}", flush=True)
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(proc)
            wait_for_port(port, proc)

        port = free_port()
        start([WEIR, "serve", "--listen", f"127.0.0.1:{port}", "--admin", "none", "--log-level", "warn",
               "--export", f"bench=mem:{SIZE >> 20}M", "--tls", "on", "--tls-certificates", certs], port)
        uris["weir"] = f"nbd://127.0.0.1:{port}/bench"
        uris["weir TLS"] = f"nbds://127.0.0.1:{port}/bench?tls-certificates={client}"
        port = free_port()
        start(["nbdkit", "-f", "-i", "127.0.0.1", "-p", str(port), "--tls=on", f"--tls-certificates={certs}",
               "-e", "bench", "memory", f"{SIZE >> 20}M"], port)
        uris["nbdkit"] = f"nbd://127.0.0.1:{port}/bench"
        uris["nbdkit TLS"] = f"nbds://127.0.0.1:{port}/bench?tls-certificates={client}"
        with open(backing, "wb") as f:
            f.truncate(SIZE)
        for name, tls in [("qemu-nbd", []), ("qemu-nbd TLS", [
                "--object", f"tls-creds-x509,id=tls0,endpoint=server,dir={certs},verify-peer=off",
                "--tls-creds", "tls0"])]:
            port = free_port()
            start(["qemu-nbd", "-b", "127.0.0.1", "-p", str(port), "-x", "bench", "-f", "raw", "-t",
                   "--shared=16", *tls, backing], port)
            scheme = "nbds" if tls else "nbd"
            query = f"?tls-certificates={client}" if tls else ""
            uris[name] = f"{scheme}://127.0.0.1:{port}/bench{query}"
        report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, "
                             f"kernel {platform.release()}",
                  "command": "bench/tls.sh " + shlex.join(sys.argv[1:]), "rounds": args.rounds, "results": {}}
        names = list(uris)
        # Data everywhere first: a server answers reads of what was never
        # written as holes, without sending the bytes.
        for name in names:
            if not name.endswith("TLS"):
                nbdcopy("write", uris[name], source, 1 << 20, 8)
        for job, direction, request_bytes, depth in JOBS:
            runs = {name: [] for name in names}
            for round_index in range(args.rounds):
                order = names[round_index % len(names):] + names[:round_index % len(names)]
                for name in order:
                    seconds = nbdcopy(direction, uris[name], source, request_bytes, depth)
                    runs[name].append(SIZE / seconds / 1e6)
            report["results"][job] = {}
            for name in names:
                rates = sorted(runs[name])
                report["results"][job][name] = {"mb_s": rates[len(rates) // 2], "min": rates[0],
                                                "max": rates[-1], "rounds": runs[name]}
                print(f"    {job:14} {name:14} {rates[len(rates) // 2]:8.1f} MB/s "
                      f"({rates[0]:.1f}-{rates[-1]:.1f})", flush=True)
    finally:
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for path in (source, backing):
            if os.path.exists(path):
                os.unlink(path)
        shutil.rmtree(tmp, ignore_errors=True)
    servers = ["weir", "nbdkit", "qemu-nbd"]
    lines = ["| job | " + " | ".join(f"{s} MB/s | {s} TLS MB/s | TLS / plain" for s in servers) + " |",
             "|---|" + "---:|" * (3 * len(servers))]
    for job, by_name in report["results"].items():
        cells = []
        for server in servers:
            plain, tls = by_name[server], by_name[f"{server} TLS"]
            cells += [f"{plain['mb_s']:.0f} ({plain['min']:.0f}-{plain['max']:.0f})",
                      f"{tls['mb_s']:.0f} ({tls['min']:.0f}-{tls['max']:.0f})",
                      f"{tls['mb_s'] / plain['mb_s']:.2f}"]
        lines.append(f"| {job} | " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print(text)
    with open(args.out + ".json", "w") as f:
        json.dump(report, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(f"Date: {report['date']}  \nMachine: {report['machine']}  \nCommand: `{report['command']}`\n\n"
                f"Median MB/s of {args.rounds} rounds (lowest-highest), nbdcopy on one connection copying "
                f"the {SIZE >> 20} MiB export.\n\n{text}\n")
    print(f"\nwrote {args.out}.md\nrerun: {report['command']}")


if __name__ == "__main__":
    main()
