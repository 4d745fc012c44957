#!/usr/bin/python3
"""Readahead off against on, over a matrix of readers and device models.

One weir serves a 4 GiB HDD, SATA SSD or NVMe model in real time, once
with --readahead off and once with --readahead on. On each, fio's nbd
engine runs random and sequential readers (4 KiB to 1 MiB, QD1 and QD8),
and a libnbd client runs two 64 KiB QD1 sequential streams each spread
round-robin over four connections (the case where a server's threads break
a stream up); then `weir bench run` drives one such stream beside a 64 KiB
QD1 random reader. Rounds alternate off and on, so drift on a shared machine
touches both alike. The table gives the median MB/s of each mode over the
rounds, the ratio of the medians, and the range of the per-round ratios:
in real time on a loaded machine one cell can move by a third between
identical runs, so a single round decides nothing.
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
import threading
import time

import nbd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import WEIR, fio, wait_for_socket  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SIZE = 4 << 30
MODELS = ["hdd", "ssd", "nvme"]
STREAMS, CONNECTIONS, STREAM_REQUEST = 2, 4, 64 << 10
JOBS = [  # name, rw, bs, iodepth, offset
    ("randread-4k-qd1", "randread", "4k", 1, 0),
    ("randread-4k-qd8", "randread", "4k", 8, 0),
    ("randread-64k-qd1", "randread", "64k", 1, 0),
    ("read-4k-qd1", "read", "4k", 1, 0),
    ("read-128k-qd1", "read", "128k", 1, 0),
    # A client keeping several small sequential reads in flight.
    ("read-4k-qd8", "read", "4k", 8, 0),
    ("read-1m-qd8", "read", "1M", 8, 0),
    # The sequential rate of the half the second stream reads: a disk's
    # outer tracks read faster than its inner ones.
    ("read-1m-qd8-from-2g", "read", "1M", 8, SIZE // STREAMS),
]
STREAMS_NAME = "streams-2x4conns-64k-qd1"
BESIDE_NAMES = ("stream+randread-64k-qd1: stream", "stream+randread-64k-qd1: randread")


def streams_mb_s(uri, seconds):
    """Two QD1 sequential streams, each request on the next of 4 connections."""
    moved = [0] * STREAMS

    def stream(k):
        handles = []
        for _ in range(CONNECTIONS):
            h = nbd.NBD()
            h.connect_uri(uri)
            handles.append(h)
        region = SIZE // STREAMS
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            handles[i % CONNECTIONS].pread(STREAM_REQUEST, k * region + (i * STREAM_REQUEST) % (region - STREAM_REQUEST))
            i += 1
        moved[k] = i * STREAM_REQUEST
        for h in handles:
            h.shutdown()

    threads = [threading.Thread(target=stream, args=(k,)) for k in range(STREAMS)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(moved) / (time.monotonic() - start) / 1e6


def beside_mb_s(uri, seconds, tmp):
    """A 64 KiB QD1 stream over four connections beside a 64 KiB QD1 random
    reader in the other half: weir's own driver, `weir bench run --uri`."""
    out = os.path.join(tmp, "beside.json")
    half = SIZE // STREAMS
    subprocess.run([WEIR, "bench", "run", "--uri", uri, "--seconds", str(seconds), "--json", out,
                    "--job", f"name=stream,rw=read,bs=64k,qd=1,offset=0,size={half},conns={CONNECTIONS}",
                    "--job", f"name=randread,rw=randread,bs=64k,qd=1,offset={half},size={half}"],
                   check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        streams = {s["name"]: s["mb_per_s"] for s in json.load(f)["runs"][0]["streams"]}
    return streams["stream"], streams["randread"]


def run_model(model, mode, runtime, tmp):
    sock = os.path.join(tmp, f"{model}-{mode}.sock")
    cmd = [WEIR, "serve", "--listen", "none", "--socket", sock, "--admin", "none", "--log-level", "warn",
           "--readahead", mode, "--export", f"v=model:{model},size={SIZE}"]
    print("  " + shlex.join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_socket(sock, proc, timeout=60)
        uri = f"nbd+unix:///v?socket={sock}"
        out = {}
        for name, rw, bs, depth, offset in JOBS:
            r = fio(["--ioengine=nbd", f"--uri={uri}", f"--rw={rw}", f"--bs={bs}", f"--iodepth={depth}",
                     f"--offset={offset}", f"--size={SIZE - offset}"], runtime)
            out[name] = r["mb_s"]
            print(f"    {model:5} {mode:3} {name:17} {r['mb_s']:8.1f} MB/s", flush=True)
        out[STREAMS_NAME] = streams_mb_s(uri, runtime)
        print(f"    {model:5} {mode:3} streams-2x4conns   {out[STREAMS_NAME]:8.1f} MB/s", flush=True)
        for name, mb_s in zip(BESIDE_NAMES, beside_mb_s(uri, runtime, tmp)):
            out[name] = mb_s
            print(f"    {model:5} {mode:3} {name} {mb_s:8.1f} MB/s", flush=True)
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def tables(report):
    rounds = report.get("rounds", 1)
    lines = [f"Command: `{report['command']}`  ", f"Machine: {report['machine']}  ", f"Date: {report['date']}  ",
             f"Rounds: {rounds} (median MB/s; the last column is the range of the per-round ratios)", "",
             "| device | reader | readahead off MB/s | on MB/s | on / off | per-round on / off |",
             "|---|---|---:|---:|---:|---|"]
    for model, modes in report["results"].items():
        for name in modes["off"][0]:
            off = [r[name] for r in modes["off"]]
            on = [r[name] for r in modes["on"]]
            ratios = [b / max(a, 1e-9) for a, b in zip(off, on)]
            mid_off, mid_on = statistics.median(off), statistics.median(on)
            lines.append(f"| {model} | {name} | {mid_off:.1f} | {mid_on:.1f} | {mid_on / max(mid_off, 1e-9):.2f} "
                         f"| {min(ratios):.2f}-{max(ratios):.2f} |")
    lines.append("")
    for model, modes in report["results"].items():
        # Each stream reads one half: judged against the mean of the two
        # halves' sequential rates, each taken with readahead off.
        sequential = statistics.median(
            (r["read-1m-qd8"] + r["read-1m-qd8-from-2g"]) / 2 for r in modes["off"])
        shares = [r[STREAMS_NAME] / sequential for r in modes["on"]]
        lines.append(f"{model}: two streams with readahead on read {statistics.median(shares):.2f} of the "
                     f"sequential rate of the halves they read ({sequential:.1f} MB/s; per round "
                     f"{min(shares):.2f}-{max(shares):.2f})  ")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runtime", type=int, default=5, help="seconds per run")
    parser.add_argument("--models", default=",".join(MODELS), help="device models: hdd,ssd,nvme")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of off and on per model (median reported)")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "readahead"),
                        help="write OUT.json and OUT.md (default: bench/results/readahead)")
    args = parser.parse_args()
    # Made now, so that a run of many minutes is not lost at its last step.
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    command = "bench/readahead.sh " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    report = {
        "command": command.strip(),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, kernel {platform.release()}",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "rounds": args.rounds,
        "results": {},
    }
    with tempfile.TemporaryDirectory(prefix="weir-readahead-") as tmp:
        for model in args.models.split(","):
            runs = {"off": [], "on": []}
            for _ in range(args.rounds):
                for mode in ("off", "on"):
                    runs[mode].append(run_model(model, mode, args.runtime, tmp))
            report["results"][model] = runs
    with open(args.out + ".json", "w") as f:
        json.dump(report, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write("### Readahead off and on, by device model and reader\n\n" + tables(report))
    print(tables(report))
    print(f"wrote {args.out}.json\nrerun: {report['command']}")


if __name__ == "__main__":
    main()
