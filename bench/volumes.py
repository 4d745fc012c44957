#!/usr/bin/python3
"""Writers on two volumes that share weir's dirty budget.

One weir with a 64 MiB budget (`--cache-dirty-max 64M`) serves two model
volumes: `slow` on the HDD model, where a 1 MiB QD8 sequential writer keeps
the budget full, and `fast` on the SATA SSD or NVMe model. Each job on
`fast` runs alone, then beside the slow volume's writer, which starts two
seconds before it. The budget is the server's, not a volume's: while both
volumes write, the one holding the most leaves an eighth of it to the other,
and when it is full, room goes first to the waiting writes of the volume
holding the least of it, so the fast volume's writers should not wait
behind the slow disk.
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
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import fio, wait_for_socket  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WEIR = os.environ.get("WEIR_BIN", os.path.join(ROOT, "target/release/weir"))
BUDGET = "64M"
DEVICES = ["ssd", "nvme"]
JOBS = [  # name, rw, bs, iodepth
    ("randwrite-4k-qd1", "randwrite", "4k", 1),
    ("randwrite-4k-qd8", "randwrite", "4k", 8),
    ("randwrite-64k-qd4", "randwrite", "64k", 4),
    ("write-1m-qd8", "write", "1M", 8),
]
SLOW_JOB = ["--rw=write", "--bs=1M", "--iodepth=8"]
SLOW_LEAD_S = 2


def run_pair(tmp, device, job, beside, runtime):
    """One server; the fast volume's job, alone or beside the slow writer."""
    sock = os.path.join(tmp, "weir.sock")
    if os.path.exists(sock):
        os.unlink(sock)
    data = tempfile.mkdtemp(dir=tmp)
    server = subprocess.Popen([WEIR, "serve", "--listen", "none", "--socket", sock, "--log-level", "warn",
                               "--data-dir", data, "--cache-dirty-max", BUDGET,
                               "--export", "slow=model:hdd,size=8G", "--export", f"fast=model:{device},size=8G"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    slow = None
    try:
        wait_for_socket(sock, server)
        uri = f"nbd+unix:///{{}}?socket={sock}"
        if beside:
            slow = subprocess.Popen(["fio", "--name=slow", "--ioengine=nbd", f"--uri={uri.format('slow')}",
                                     "--size=8G", f"--runtime={runtime + SLOW_LEAD_S + 2}", "--time_based",
                                     "--output-format=json", *SLOW_JOB],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            time.sleep(SLOW_LEAD_S)
        _, rw, bs, depth = job
        fast = fio(["--ioengine=nbd", f"--uri={uri.format('fast')}", "--size=8G", f"--rw={rw}", f"--bs={bs}",
                    f"--iodepth={depth}"], runtime)
        slow_mb_s = None
        if slow:
            out, _ = slow.communicate(timeout=runtime + 120)
            side = json.loads(out[out.index("{"):])["jobs"][0]["write"]
            slow_mb_s = side["bw_bytes"] / 1e6
        return fast, slow_mb_s
    finally:
        if slow and slow.poll() is None:
            slow.kill()
        server.terminate()
        server.wait(timeout=60)


def micros(us):
    return f"{us / 1000:.1f} ms" if us >= 1000 else f"{us:.0f} us"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runtime", type=int, default=8, help="seconds of each fast-volume job")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "volumes"))
    args = parser.parse_args()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, kernel {platform.release()}",
              "command": "bench/volumes.sh " + shlex.join(sys.argv[1:]), "runtime_s": args.runtime, "rows": []}
    lines = ["### A fast volume's writers beside a slow volume's that fills the budget", "",
             f"Budget {BUDGET}; the slow volume (HDD model) runs fio `{' '.join(SLOW_JOB)}` throughout the "
             "\"beside\" runs.", "",
             "| fast volume | job | alone IOPS | alone p99 | beside IOPS | beside p99 | beside / alone | "
             "slow writer MB/s |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory(prefix="weir-bench-volumes-") as tmp:
        for device in DEVICES:
            for job in JOBS:
                alone, _ = run_pair(tmp, device, job, False, args.runtime)
                beside, slow_mb_s = run_pair(tmp, device, job, True, args.runtime)
                ratio = beside["iops"] / alone["iops"] if alone["iops"] else 0.0
                report["rows"].append({"device": device, "job": job[0], "alone": alone, "beside": beside,
                                       "slow_mb_s": slow_mb_s})
                line = (f"| {device} | {job[0]} | {alone['iops']:.0f} | {micros(alone['p99_us'])} | "
                        f"{beside['iops']:.0f} | {micros(beside['p99_us'])} | {ratio:.2f} | {slow_mb_s:.0f} |")
                print(line, flush=True)
                lines.append(line)
    text = "\n".join(lines)
    with open(args.out + ".json", "w") as f:
        json.dump(report, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(f"Date: {report['date']}  \nMachine: {report['machine']}  \nCommand: `{report['command']}`\n\n")
        f.write(text + "\n")
    print(f"\nwrote {args.out}.md\nrerun: {report['command']}")


if __name__ == "__main__":
    main()
