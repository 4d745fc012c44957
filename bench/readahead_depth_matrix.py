#!/usr/bin/python3
"""Readahead over a matrix of sequential and random readers, in virtual
time: block sizes 4 KiB-1 MiB, queue depths 1-16, one connection or four,
on the HDD, SSD and NVMe models, each with readahead off and on.

Usage: bench/readahead_depth_matrix.py [--seconds S] [--out bench/results/readahead-depth-matrix.md]
(WEIR_BIN names another build of weir to run.)

Each cell gives MB/s with readahead off, then on, and their ratio. A
client that keeps several sequential reads in flight is the case this
shows beside `weir bench readahead`: whether its reads, too small for the
device, are read ahead in larger ones, and whether one whose reads are
already large enough is left alone. Random readers must come out equal.
Both sides run the device queue in adaptive mode, as `weir serve` runs a
raw export with its defaults (write-back cache and readahead on).
Needs target/release/weir (cargo build --release).
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WEIR = os.environ.get("WEIR_BIN", os.path.join(ROOT, "target", "release", "weir"))
DEVICES = ["hdd", "ssd", "nvme"]
SIZES = ["4k", "16k", "64k", "256k", "1m"]
DEPTHS = [1, 2, 4, 8, 16]
READERS = [("read", 1), ("read", 4), ("randread", 1)]


def run(device, readahead, job, seconds):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [WEIR, "bench", "run", "--sim", "--device", f"model:{device},size=4G", "--sched", "adaptive",
               "--readahead", readahead, "--seconds", str(seconds), "--json", out.name, "--job", job]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        stream = json.load(open(out.name))["runs"][0]["streams"][0]
    return stream["mb_per_s"], stream["latency_us"]["p99"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "readahead-depth-matrix.md"))
    args = parser.parse_args()
    # Made now, so that a run of many minutes is not lost at its last step.
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    if not os.path.exists(WEIR):
        sys.exit("build first: cargo build --release")
    rows = []
    worst = {}
    for device in DEVICES:
        for rw, conns in READERS:
            for size in SIZES:
                cells = []
                for depth in DEPTHS:
                    job = f"name=r,rw={rw},bs={size},qd={depth},conns={conns}"
                    off, p99_off = run(device, "off", job, args.seconds)
                    on, p99_on = run(device, "on", job, args.seconds)
                    ratio = on / max(off, 1e-9)
                    cells.append((off, on, ratio, p99_on / max(p99_off, 1e-9)))
                    key = (device, rw)
                    worst[key] = min(worst.get(key, ratio), ratio)
                rows.append((device, rw, conns, size, cells))
                print(device, rw, conns, size,
                      " | ".join(f"{off:.0f}>{on:.0f} ({r:.2f})" for off, on, r, _ in cells), flush=True)
    shown = ["bench/readahead_depth_matrix.py", "--seconds", str(args.seconds)]
    head = (f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}  \n"
            f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, kernel {platform.release()}  \n"
            f"Command: `{shlex.join(shown)}`\n\n"
            "Each cell: MB/s with readahead off → on (on / off; p99 on / off).\n\n")
    table = ["| device | reader | connections | block | "
             + " | ".join(f"QD{d}" for d in DEPTHS) + " |",
             "|---|---|---:|---|" + "---|" * len(DEPTHS)]
    for device, rw, conns, size, cells in rows:
        table.append(f"| {device} | {rw} | {conns} | {size} | "
                     + " | ".join(f"{off:.0f} → {on:.0f} ({r:.2f}; {p:.2f})" for off, on, r, p in cells)
                     + " |")
    lowest = "\n".join(f"- {device} {rw}: lowest on / off {ratio:.2f}"
                       for (device, rw), ratio in worst.items())
    with open(args.out, "w") as f:
        f.write(head + "\n".join(table) + "\n\n" + lowest + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
