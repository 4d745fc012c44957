#!/usr/bin/python3
"""Pools against raw volumes, same fio jobs, one run.

Setting "files": a 2-way mirror pool volume on two files vs a raw export of
one file vs qemu-nbd on one file (cache=none, io_uring), all on the same
disk. Checksumming should cost at most 10% of 4 KiB randread QD32 IOPS and
of 1 MiB sequential read throughput, against the raw weir volume.

Setting "nvme": a mirror of two model:nvme devices (store=file) vs a raw
export of one model:nvme: mirrored 1 MiB sequential reads at QD8 should use
both copies and beat one device. The models' link is set to 1000 MB/s
(link_mb_s=1000): at the default 3.2 GB/s the NBD path on a 2-CPU machine, not
the device, is the limit, and no mirror could show anything.

The targets run side by side; each job runs on every target once per round
in a rotating order, and the median round is reported (see bench/peers.py).
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import WEIR, fio, run_interleaved, wait_for_socket  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
GIB = 1 << 30
JOBS = [
    ("randread-4k-qd32", "randread", "4k", 32),
    ("seqread-1m-qd8", "read", "1M", 8),
    ("randwrite-4k-qd32", "randwrite", "4k", 32),
    ("seqwrite-1m-qd8", "write", "1M", 8),
]


def sh(*cmd):
    subprocess.run(cmd, check=True, capture_output=True, timeout=900)


def fill(uri, size):
    sh("fio", "--name=fill", "--ioengine=nbd", f"--uri={uri}", "--rw=write", "--bs=1M", "--iodepth=8",
       f"--size={size}", "--output-format=terse")


def table(title, results, baseline, jobs):
    lines = [f"### {title}", "", "| job | target | IOPS | IOPS spread | MB/s | p50 us | p99 us |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for job, *_ in jobs:
        for name, by_job in results.items():
            r = by_job[job]
            lines.append(f"| {job} | {name} | {r['iops']:.0f} | {r['iops_min']:.0f}-{r['iops_max']:.0f} | "
                         f"{r['mb_s']:.1f} | {r['p50_us']:.1f} | {r['p99_us']:.1f} |")
    lines += ["", f"| job | pool / {baseline} |", "|---|---:|"]
    pool = next(n for n in results if n.startswith("weir pool"))
    ratios = {}
    for job, *_ in jobs:
        ratios[job] = results[pool][job]["iops"] / results[baseline][job]["iops"]
        lines.append(f"| {job} | {ratios[job]:.2f} |")
    if f"{pool} (baseline)" in results:
        lines += ["", f"| job | pool / {baseline}, baseline build | pool: this build / baseline | "
                      f"{baseline}: this build / baseline |", "|---|---:|---:|---:|"]
        for job, *_ in jobs:
            old_pool, old_raw = results[f"{pool} (baseline)"][job], results[f"{baseline} (baseline)"][job]
            lines.append(f"| {job} | {old_pool['iops'] / old_raw['iops']:.2f} | "
                         f"{results[pool][job]['iops'] / old_pool['iops']:.2f} | "
                         f"{results[baseline][job]['iops'] / old_raw['iops']:.2f} |")
    return "\n".join(lines), ratios


def serve(tmp, name, args, weir=WEIR):
    sock = os.path.join(tmp, f"{name}.sock")
    cmd = [weir, "serve", "--listen", "none", "--socket", sock, "--admin", "127.0.0.1:0", "--log-level", "warn", *args]
    print("  " + shlex.join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_socket(sock, proc, timeout=120)
    return proc, sock


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runtime", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settings", default="files,nvme")
    parser.add_argument("--dir", default="/var/tmp", help="where the backing files live (O_DIRECT)")
    parser.add_argument("--baseline", metavar="WEIR_BIN",
                        help="also run the files setting with this weir binary (an older build) on pools "
                             "of its own, reported as '(baseline)' targets")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "pool"),
                        help="write OUT.json and OUT.md (default: bench/results/pool)")
    args = parser.parse_args()
    # Made now, so that a run of many minutes is not lost at its last step.
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="weir-pool-bench-")
    data = os.path.join(tmp, "data")
    procs = []
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, kernel {platform.release()}",
              "command": "bench/pool.sh " + shlex.join(sys.argv[1:]), "settings": {}}
    markdown = []
    try:
        if "files" in args.settings.split(","):
            print("== files: mirror pool vs raw file vs qemu-nbd", flush=True)
            builds = [("", WEIR)] + ([(" (baseline)", args.baseline)] if args.baseline else [])
            targets = {}
            for suffix, weir in builds:
                tag = "base-" if suffix else ""
                a, b, raw = (os.path.join(args.dir, f"weir-pool-bench-{tag}{n}.img") for n in ("a", "b", "raw"))
                for path in (a, b, raw):
                    sh("fallocate", "-l", str(2 * GIB), path)
                bdata = data + tag
                sh(weir, "pool", "create", "tank", "mirror", a, b, "--data-dir", bdata)
                sh(weir, "volume", "create", "tank/disk", "--size", "1G", "--data-dir", bdata)
                proc, sock = serve(tmp, "files" + tag, ["--data-dir", bdata, "--export", f"raw={raw}"], weir)
                procs.append(proc)
                targets[f"weir pool (2-way mirror){suffix}"] = f"nbd+unix:///tank/disk?socket={sock}"
                targets[f"weir raw file{suffix}"] = f"nbd+unix:///raw?socket={sock}"
            qsock = os.path.join(tmp, "qemu.sock")
            qproc = subprocess.Popen(["qemu-nbd", "-k", qsock, "-x", "bench", "-t", "--shared=16", "--cache=none",
                                      "--aio=io_uring", "-f", "raw", raw], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
            procs.append(qproc)
            wait_for_socket(qsock, qproc)
            targets["qemu-nbd raw file"] = f"nbd+unix:///bench?socket={qsock}"
            for uri in targets.values():
                fill(uri, "1G")
            results = run_interleaved({n: ["--ioengine=nbd", f"--uri={u}", "--size=1G"] for n, u in targets.items()},
                                      args.runtime, args.rounds, JOBS)
            text, ratios = table("Files: mirror pool vs raw", results, "weir raw file", JOBS)
            report["settings"]["files"] = {"results": results, "pool_over_raw": ratios}
            markdown.append(text)
            print(text, flush=True)
        if "nvme" in args.settings.split(","):
            print("== nvme models: mirror pool vs one device", flush=True)
            stores = [os.path.join(args.dir, f"weir-pool-bench-n{i}.img") for i in range(3)]
            for path in stores:
                if os.path.exists(path):
                    os.unlink(path)
            ndata = os.path.join(tmp, "ndata")
            model = "model:nvme,link_mb_s=1000"
            members = [f"{model},size=2G,store=file:{p}" for p in stores[:2]]
            sh(WEIR, "pool", "create", "fast", "mirror", *members, "--data-dir", ndata)
            sh(WEIR, "volume", "create", "fast/disk", "--size", "1G", "--data-dir", ndata)
            proc, sock = serve(tmp, "nvme", ["--data-dir", ndata, "--export",
                                             f"one={model},size=1G,store=file:{stores[2]}"])
            procs.append(proc)
            targets = {
                "weir pool (2 x model:nvme)": f"nbd+unix:///fast/disk?socket={sock}",
                "weir model:nvme": f"nbd+unix:///one?socket={sock}",
            }
            for uri in targets.values():
                fill(uri, "1G")
            jobs = [j for j in JOBS if j[0] == "seqread-1m-qd8"]
            results = run_interleaved({n: ["--ioengine=nbd", f"--uri={u}", "--size=1G"] for n, u in targets.items()},
                                      args.runtime, args.rounds, jobs)
            text, ratios = table("NVMe models: mirror of two vs one device", results, "weir model:nvme", jobs)
            report["settings"]["nvme"] = {"results": results, "pool_over_one": ratios}
            markdown.append(text)
            print(text, flush=True)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        for name in os.listdir(args.dir):
            if name.startswith("weir-pool-bench-"):
                os.unlink(os.path.join(args.dir, name))
    out = args.out
    with open(out + ".json", "w") as f:
        json.dump(report, f, indent=1)
    with open(out + ".md", "w") as f:
        f.write(f"Date: {report['date']}  \nMachine: {report['machine']}  \nCommand: `{report['command']}`\n\n")
        f.write("\n\n".join(markdown) + "\n")
    print(f"\nwrote {out}.json\nrerun: {report['command']}")


if __name__ == "__main__":
    main()
