"""Large reads answered whole against in pieces, through fio's nbd engine.

Usage: bench/read_pieces_matrix.py BASELINE_WEIR [SECONDS]

BASELINE_WEIR is a weir that answers every read whole (one built from a
commit before reads went in pieces); this checkout's release build answers
them in pieces. Each cell starts a fresh server of each binary on the same
device and runs one fio job of SECONDS on it, the two binaries one after the
other, so the piece length is measured from scratch in every cell. On the
shared 2-CPU machines these run on a cell moves by 10-15% between identical
runs: read single cells as noise, the rows together as the answer.
"""
import datetime
import os
import platform
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from peers import fio, wait_for_socket  # noqa: E402

NEW = os.path.join(HERE, "..", "target", "release", "weir")
FILE = "/var/tmp/weir-read-pieces.img"
TARGETS = ["model:nvme,size=4G", "model:ssd,size=4G", "model:hdd,size=4G", "file"]
JOBS = [(rw, bs, qd) for rw in ("randread", "read") for bs in ("128k", "256k", "1M", "4M") for qd in (1, 8)]


def serve(binary, spec, tmp):
    sock = f"{tmp}/s"
    p = subprocess.Popen([binary, "serve", "--listen", "none", "--socket", sock, "--admin", "none",
                          "--log-level", "error", "--data-dir", tmp, "--export", f"v={spec}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_socket(sock, p)
    return p, f"nbd+unix:///v?socket={sock}"


def main():
    base = sys.argv[1]
    secs = float(sys.argv[2]) if len(sys.argv) > 2 else 3
    print("### Large reads whole against in pieces\n")
    print(f"Command: `{shlex.join(['bench/read_pieces_matrix.py', *sys.argv[1:]])}`  ")
    print(f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, kernel {platform.release()}  ")
    print(f"Date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}\n")
    print("| target | job | whole MB/s | pieces MB/s | pieces / whole | p99 whole us | p99 pieces us |")
    print("|---|---|---:|---:|---:|---:|---:|", flush=True)
    for target in TARGETS:
        spec = target
        if target == "file":
            subprocess.run(["fio", "--name=fill", f"--filename={FILE}", "--rw=write", "--bs=1M", "--size=2G",
                            "--direct=1", "--output-format=terse"], check=True, capture_output=True)
            spec = FILE
        for rw, bs, qd in JOBS:
            res = {}
            for name, binary in (("whole", base), ("pieces", NEW)):
                with tempfile.TemporaryDirectory() as tmp:
                    p, uri = serve(binary, spec, tmp)
                    try:
                        res[name] = fio(["--ioengine=nbd", f"--uri={uri}", f"--rw={rw}", f"--bs={bs}",
                                         f"--iodepth={qd}", "--size=2G"], secs)
                    finally:
                        p.terminate()
                        p.wait()
            w, n = res["whole"], res["pieces"]
            print(f"| {target.split(',')[0]} | {rw} {bs} QD{qd} | {w['mb_s']:.0f} | {n['mb_s']:.0f} | "
                  f"{n['mb_s'] / max(w['mb_s'], 1e-9):.2f} | {w['p99_us']:.0f} | {n['p99_us']:.0f} |", flush=True)
    if os.path.exists(FILE):
        os.unlink(FILE)


if __name__ == "__main__":
    main()
