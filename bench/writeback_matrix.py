#!/usr/bin/python3
"""The write-back cache's throttles over a matrix of readers and writers, in
virtual time: each reader alone, then beside each writer through the cache
under each throttle (none, wbt, adaptive), on the HDD, SSD and NVMe models.

Usage: bench/writeback_matrix.py [--seconds S] [--seeds N] [--out bench/results/writeback-matrix.md]
(WEIR_BIN names another build of weir to run.)

For each cell it reports the reader's p99 over its p99 alone, and the
writer's MB/s, each the median over N seeds (3 by default): an open-loop
reader near its device's capacity queues up or not by chance, and one
seed can make a throttle look better or worse than it is. Needs
target/release/weir (cargo build --release).
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WEIR = os.environ.get("WEIR_BIN", os.path.join(ROOT, "target", "release", "weir"))
DEVICES = ["hdd", "ssd", "nvme"]
# Readers: closed loop at QD 1, 8 and 4 with 4 KiB-64 KiB blocks, and
# open loop at half the rate the QD1 reader gets alone.
READERS = [
    ("4k qd1", "rw=randread,bs=4k,qd=1"),
    ("4k qd8", "rw=randread,bs=4k,qd=8"),
    ("64k qd4", "rw=randread,bs=64k,qd=4"),
    ("4k open", None),
]
WRITERS = [
    ("seq 1m qd8", "rw=write,bs=1m,qd=8"),
    ("rand 64k qd4", "rw=randwrite,bs=64k,qd=4"),
    ("seq 128k qd1", "rw=write,bs=128k,qd=1"),
]
THROTTLES = ["none", "wbt", "adaptive"]


def run(device, jobs, seconds, cache=None, seed=1):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [WEIR, "bench", "run", "--sim", "--device", f"model:{device},size=64G",
               "--seconds", str(seconds), "--seed", str(seed), "--json", out.name]
        if cache:
            cmd += ["--cache", "writeback", "--wb-throttle", cache]
        else:
            cmd += ["--sched", "adaptive"]
        for job in jobs:
            cmd += ["--job", job]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        streams = json.load(open(out.name))["runs"][0]["streams"]
    return {s["name"]: s for s in streams}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "writeback-matrix.md"))
    args = parser.parse_args()
    # Made now, so that a run of many minutes is not lost at its last step.
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    if not os.path.exists(WEIR):
        sys.exit("build first: cargo build --release")
    start = args.seconds * 0.2
    window = f"start={start},stop={args.seconds}"
    rows = []
    for device in DEVICES:
        qd1 = run(device, [f"name=r,rw=randread,bs=4k,qd=1,{window}"], args.seconds)["r"]
        for reader_name, reader in READERS:
            if reader is None:
                rate = max(1.0, 0.5 * qd1["iops"])
                reader = f"rw=randread,bs=4k,qd=8,rate={rate:.0f}/s"
            reader_job = f"name=r,{reader},{window}"
            seeds = range(1, args.seeds + 1)
            idle_p99 = statistics.median(
                max(run(device, [reader_job], args.seconds, seed=seed)["r"]["latency_us"]["p99"], 1e-9)
                for seed in seeds)
            for writer_name, writer in WRITERS:
                cells = []
                for throttle in THROTTLES:
                    runs = [run(device, [reader_job, f"name=w,{writer},{window}"], args.seconds,
                                throttle, seed) for seed in seeds]
                    cells.append((statistics.median(s["r"]["latency_us"]["p99"] for s in runs) / idle_p99,
                                  statistics.median(s["w"]["mb_per_s"] for s in runs)))
                rows.append((device, reader_name, writer_name, idle_p99, cells))
                print(device, reader_name, writer_name,
                      " | ".join(f"{t} {p:.1f}x {w:.0f} MB/s" for t, (p, w) in zip(THROTTLES, cells)),
                      flush=True)
    shown = ["bench/writeback_matrix.py", "--seconds", str(args.seconds), "--seeds", str(args.seeds)]
    head = (f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}  \n"
            f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, kernel {platform.release()}  \n"
            f"Command: `{shlex.join(shown)}`\n\n")
    table = ["| device | reader | writer | reader p99 alone | "
             + " | ".join(f"{t}: p99 / alone, writer MB/s" for t in THROTTLES) + " |",
             "|---|---|---|---:|" + "---:|" * len(THROTTLES)]
    for device, reader_name, writer_name, idle_p99, cells in rows:
        table.append(f"| {device} | {reader_name} | {writer_name} | {idle_p99:.0f} us | "
                     + " | ".join(f"{p:.1f} x, {w:.0f}" for p, w in cells) + " |")
    with open(args.out, "w") as f:
        f.write(head + "\n".join(table) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
