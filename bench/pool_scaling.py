#!/usr/bin/python3
"""How a mirror pool volume's writes scale with connections.

A 2-way mirror pool whose members are files in memory (/dev/shm), so the
server's own dispatch, not a disk, is what is measured. fio's nbd engine
runs N jobs (N connections), each writing its own region of the volume:
128 KiB sequential writes at QD1 and 4 KiB random writes at QD32, for N =
1, 2, 4, 8, 16, 32. For each cell it records throughput, p99, the server's
CPU seconds per GiB written (from /proc, user + system) and its thread
count in the middle of the run: weir's own threads, and apart from them
the kernel's io_uring workers (iou-wrk), which the kernel starts for I/O
that cannot be issued without blocking (writes to tmpfs files among it)
and ends when idle.

With --baseline WEIR_BIN an older build serves a pool of its own beside the
new one, and every cell runs on both in alternating order, so the two
builds are compared within one run.
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
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import FIO_COMMON, WEIR, wait_for_socket  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
GIB = 1 << 30
VOLUME = 2 * GIB
MEMBER = 3 * GIB
WORKLOADS = [  # name, rw, bs, iodepth
    ("seqwrite-128k-qd1", "write", "128k", 1),
    ("randwrite-4k-qd32", "randwrite", "4k", 32),
]
JOB_COUNTS = [1, 2, 4, 8, 16, 32]
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def threads(pid):
    """(weir's own threads, the kernel's io_uring workers serving them)."""
    own = io_workers = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue  # ended meanwhile
        if name.startswith("iou-"):
            io_workers += 1
        else:
            own += 1
    return own, io_workers


def sh(*cmd):
    subprocess.run(cmd, check=True, capture_output=True, timeout=900)


class Build:
    """One weir build serving its own mirror pool of two /dev/shm files."""

    def __init__(self, name, weir, tmp, shm, extra=()):
        self.name = name
        data = os.path.join(tmp, f"data-{name}")
        members = [os.path.join(shm, f"weir-scaling-{os.getpid()}-{name}-{i}.img") for i in range(2)]
        for path in members:
            with open(path, "wb") as f:
                f.truncate(MEMBER)
        self.members = members
        sh(weir, "pool", "create", "tank", "mirror", *members, "--data-dir", data)
        sh(weir, "volume", "create", "tank/disk", "--size", str(VOLUME), "--data-dir", data)
        sock = os.path.join(tmp, f"{name}.sock")
        cmd = [weir, "serve", "--listen", "none", "--socket", sock, "--admin", "127.0.0.1:0",
               "--data-dir", data, "--log-level", "warn", *extra]
        print(f"  {name}: {shlex.join(cmd)}", flush=True)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_socket(sock, self.proc, timeout=120)
        self.uri = f"nbd+unix:///tank/disk?socket={sock}"
        self.idle_threads = threads(self.proc.pid)[0]

    def run(self, rw, bs, depth, jobs, runtime):
        region = VOLUME // jobs
        cmd = ["fio", "--name=job", f"--runtime={runtime}", *FIO_COMMON, "--ioengine=nbd", f"--uri={self.uri}",
               f"--rw={rw}", f"--bs={bs}", f"--iodepth={depth}", f"--numjobs={jobs}", "--group_reporting",
               f"--size={region}", f"--offset_increment={region}"]
        peak = [(0, 0)]

        def sample():
            time.sleep(runtime / 2)
            peak[0] = threads(self.proc.pid)

        sampler = threading.Thread(target=sample)
        before = cpu_seconds(self.proc.pid)
        sampler.start()
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=runtime + 300)
        sampler.join()
        used = cpu_seconds(self.proc.pid) - before
        if out.returncode != 0:
            raise RuntimeError(f"fio failed: {shlex.join(cmd)}\n{out.stderr}")
        job = json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]["write"]
        written = job["io_bytes"]
        return {
            "iops": job["iops"],
            "mb_s": job["bw_bytes"] / 1e6,
            "p99_us": job["clat_ns"].get("percentile", {}).get("99.000000", 0) / 1000,
            "cpu_s_per_gib": used / (written / GIB) if written else float("inf"),
            "threads": peak[0][0],
            "io_workers": peak[0][1],
        }

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        for path in self.members:
            os.unlink(path)


def table(results, names):
    lines = ["### Mirror pool on /dev/shm files: writes by connection count", "",
             "Median of the rounds by MB/s, with the spread; the other columns are that round's.", "",
             "| workload | jobs | build | MB/s | MB/s spread | IOPS | p99 us | CPU s / GiB | server threads | kernel io_uring workers |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for (workload, jobs), by_build in results.items():
        for name in names:
            r = by_build[name]
            lines.append(f"| {workload} | {jobs} | {name} | {r['mb_s']:.1f} | {r['mb_s_min']:.0f}-{r['mb_s_max']:.0f} | "
                         f"{r['iops']:.0f} | {r['p99_us']:.0f} | "
                         f"{r['cpu_s_per_gib']:.2f} | {r['threads']} | {r.get('io_workers', 0)} |")
    if len(names) == 2:
        new, old = names
        lines += ["", f"| workload | jobs | throughput {new} / {old} | CPU per GiB {new} / {old} |",
                  "|---|---:|---:|---:|"]
        for (workload, jobs), by_build in results.items():
            a, b = by_build[new], by_build[old]
            lines.append(f"| {workload} | {jobs} | {a['mb_s'] / max(b['mb_s'], 1e-9):.2f} | "
                         f"{a['cpu_s_per_gib'] / max(b['cpu_s_per_gib'], 1e-9):.2f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runtime", type=int, default=5, help="seconds per run")
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs of every cell on every build, alternating; the median (by MB/s) is reported")
    parser.add_argument("--jobs", default=",".join(map(str, JOB_COUNTS)), help="connection counts to run")
    parser.add_argument("--baseline", metavar="WEIR_BIN", help="an older build to compare, served beside")
    parser.add_argument("--cache", choices=["writeback", "writethrough"],
                        help="the new build's cache mode (default: its own default); the baseline runs as it is")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "pool-scaling"),
                        help="write OUT.json and OUT.md (default: bench/results/pool-scaling)")
    args = parser.parse_args()
    # Made now, so that a run of many minutes is not lost at its last step.
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    job_counts = [int(j) for j in args.jobs.split(",")]
    shm = "/dev/shm"
    tmp = tempfile.mkdtemp(prefix="weir-scaling-")
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, kernel {platform.release()}",
              "command": "bench/pool-scaling.sh " + shlex.join(sys.argv[1:]), "results": []}
    builds = []
    try:
        builds.append(Build("weir", WEIR, tmp, shm, ["--cache", args.cache] if args.cache else []))
        if args.baseline:
            builds.append(Build("baseline", args.baseline, tmp, shm))
        results = {}
        turn = 0
        for workload, rw, bs, depth in WORKLOADS:
            for jobs in job_counts:
                runs = {b.name: [] for b in builds}
                for _ in range(args.rounds):
                    order = builds[turn % len(builds):] + builds[:turn % len(builds)]
                    turn += 1
                    for build in order:
                        r = build.run(rw, bs, depth, jobs, args.runtime)
                        runs[build.name].append(r)
                        print(f"    {workload:18} {jobs:3} jobs  {build.name:9} {r['mb_s']:9.1f} MB/s "
                              f"{r['cpu_s_per_gib']:6.2f} CPU s/GiB  {r['threads']:4} threads", flush=True)
                cell = {}
                for name, rs in runs.items():
                    ordered = sorted(rs, key=lambda r: r["mb_s"])
                    cell[name] = dict(ordered[len(ordered) // 2])
                    cell[name]["mb_s_min"], cell[name]["mb_s_max"] = ordered[0]["mb_s"], ordered[-1]["mb_s"]
                results[(workload, jobs)] = cell
                report["results"].append({"workload": workload, "jobs": jobs, **{n: v for n, v in cell.items()}})
        report["idle_threads"] = {b.name: b.idle_threads for b in builds}
    finally:
        for build in builds:
            build.stop()
    text = table(results, [b.name for b in builds])
    mode = args.cache or "writeback, the default"
    text = text.replace("writes by connection count", f"writes by connection count (weir's cache: {mode})", 1)
    idle = ", ".join(f"{n}: {t}" for n, t in report["idle_threads"].items())
    text += f"\n\nServer threads with no client connected: {idle}.\n"
    print(text, flush=True)
    with open(args.out + ".json", "w") as f:
        json.dump(report, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(f"Date: {report['date']}  \nMachine: {report['machine']}  \nCommand: `{report['command']}`\n\n")
        f.write(text)
    print(f"\nwrote {args.out}.json\nrerun: {report['command']}")


if __name__ == "__main__":
    main()
