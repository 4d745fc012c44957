#!/usr/bin/python3
"""weir vs qemu-nbd and nbdkit (and the raw device), same fio jobs, one run.

Setting "memory": weir mem:2G, nbdkit memory 2G, qemu-nbd on a /dev/shm file.
Setting "direct": one pre-filled 2 GiB file served by weir (O_DIRECT,
io_uring), qemu-nbd --cache=none --aio=io_uring, qemu-storage-daemon with
cache.direct=on,aio=io_uring; nbdkit file (page cache; reference only); and
fio's io_uring engine on the file with direct=1 as the limit.

Every NBD job uses fio's nbd engine over a Unix socket. Exports are filled
with data first so that nobody serves holes. The servers of a setting run
side by side; each job runs on every target once per round (default 3
rounds of 5 s, so 15 s per job and target), interleaved, and the median
round is reported with the spread: a shared machine's disk and CPUs drift by tens of
percent over minutes, and running the servers one after another let that
drift decide the ratios.
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WEIR = os.environ.get("WEIR_BIN", os.path.join(ROOT, "target/release/weir"))
SIZE = 2 << 30
JOBS = [  # name, rw, bs, iodepth
    ("randread-4k-qd1", "randread", "4k", 1),
    ("randread-4k-qd32", "randread", "4k", 32),
    ("seqread-1m-qd8", "read", "1M", 8),
    ("randwrite-4k-qd32", "randwrite", "4k", 32),
    ("seqwrite-1m-qd8", "write", "1M", 8),
]
# Not run unless named with --jobs. Unaligned
# writes take a read-modify-write in every server; fio's O_DIRECT limit
# cannot run them and is left out of those rows.
EXTRA_JOBS = [
    ("randwrite-1000b-qd32", "randwrite", "1000", 32),
]
LIMIT = "fio io_uring direct (limit)"
BASELINE = "weir baseline"


def can_run(target, bs):
    """O_DIRECT needs whole 512-byte sectors; NBD takes any length."""
    return target != LIMIT or bs[-1].isalpha() or int(bs) % 512 == 0
# invalidate=0: fio must not drop caches between jobs; every server here is
# measured as it runs, and the direct-I/O ones bypass the page cache anyway.
FIO_COMMON = ["--invalidate=0", "--randrepeat=0", "--norandommap", "--time_based", "--output-format=json"]


def wait_for_socket(path, proc, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early: {proc.args}")
        if os.path.exists(path):
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(path)
                    return
            except OSError:
                pass
        time.sleep(0.05)
    raise RuntimeError(f"no socket at {path}")


def fio(args, runtime):
    cmd = ["fio", "--name=job", f"--runtime={runtime}", *FIO_COMMON, *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=runtime + 120)
    if out.returncode != 0:
        raise RuntimeError(f"fio failed: {shlex.join(cmd)}\n{out.stderr}")
    job = json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]
    side = job["read"] if job["read"]["io_bytes"] else job["write"]
    pct = side["clat_ns"].get("percentile", {})
    return {
        "iops": side["iops"],
        "mb_s": side["bw_bytes"] / 1e6,
        "p50_us": pct.get("50.000000", 0) / 1000,
        "p99_us": pct.get("99.000000", 0) / 1000,
        "max_us": side["lat_ns"]["max"] / 1000,
    }


def fill(uri):
    subprocess.run(["fio", "--name=fill", "--ioengine=nbd", f"--uri={uri}", "--rw=write", "--bs=1M",
                    "--iodepth=8", f"--size={SIZE}", "--output-format=terse"], check=True,
                   capture_output=True, timeout=600)


class Servers:
    """Every server of a setting, all running at once, each on its own socket."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.procs = {}
        self.uris = {}

    def start(self, name, make_cmd, prefill=True):
        sock = os.path.join(self.tmp, f"{len(self.procs)}.sock")
        cmd = make_cmd(sock)
        print(f"  {name}: {shlex.join(cmd)}", flush=True)
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs[name] = proc
        wait_for_socket(sock, proc)
        self.uris[name] = f"nbd+unix:///bench?socket={sock}"
        if prefill:
            fill(self.uris[name])

    def stop(self):
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def run_interleaved(targets, runtime, rounds, selected_jobs):
    """targets: name -> fio args without the job's own. For each job, every
    round runs every target once, in an order that rotates, so a device or
    host that drifts during the run affects every target alike. Each target
    reports the median of its rounds (by IOPS) and the spread."""
    results = {name: {} for name in targets}
    names = list(targets)
    for job, rw, bs, depth in selected_jobs:
        runs = {name: [] for name in names}
        for round_index in range(rounds):
            order = names[round_index % len(names):] + names[:round_index % len(names)]
            for name in order:
                if can_run(name, bs):
                    runs[name].append(fio([*targets[name], f"--rw={rw}", f"--bs={bs}", f"--iodepth={depth}"],
                                          runtime))
        for name in names:
            if not runs[name]:
                continue
            ordered = sorted(runs[name], key=lambda r: r["iops"])
            median = dict(ordered[len(ordered) // 2])
            median["iops_min"], median["iops_max"] = ordered[0]["iops"], ordered[-1]["iops"]
            median["rounds"] = runs[name]
            results[name][job] = median
            print(f"    {job:18} {name:38} {median['iops']:10.0f} IOPS (min {median['iops_min']:.0f}, "
                  f"max {median['iops_max']:.0f}) {median['mb_s']:8.1f} MB/s  p99 {median['p99_us']:8.1f} us",
                  flush=True)
    return results


def nbd_targets(servers):
    return {name: ["--ioengine=nbd", f"--uri={uri}"] for name, uri in servers.uris.items()}


def table(title, results, peers, limit=None):
    lines = [f"### {title}", "",
             "Median of the rounds by IOPS (the spread is the lowest and highest round); latencies are "
             "that median round's.", "",
             "| job | server | IOPS | IOPS spread | MB/s | p50 us | p99 us | max us |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    verdicts = []
    for job in results["weir"]:
        for server, by_job in results.items():
            if job not in by_job:
                continue
            r = by_job[job]
            lines.append(f"| {job} | {server} | {r['iops']:.0f} | {r['iops_min']:.0f}-{r['iops_max']:.0f} | "
                         f"{r['mb_s']:.1f} | {r['p50_us']:.1f} | {r['p99_us']:.1f} | {r['max_us']:.0f} |")
        best = max(peers, key=lambda p: results[p][job]["iops"])
        w, b = results["weir"][job], results[best][job]
        ratio = w["iops"] / b["iops"]
        best_p99 = min(results[p][job]["p99_us"] for p in peers)
        verdict = {"job": job, "best_peer": best, "ratio": ratio, "weir_p99_us": w["p99_us"],
                   "best_peer_p99_us": best_p99, "p99_ok": w["p99_us"] <= best_p99}
        if limit:
            limit_job = results[limit].get(job)
            verdict["of_limit"] = w["iops"] / limit_job["iops"] if limit_job else None
        verdicts.append(verdict)
    lines += ["", "| job | best peer | weir / best peer | weir p99 <= best peer p99 |" +
              (" weir / io_uring limit |" if limit else ""),
              "|---|---|---:|---|" + ("---:|" if limit else "")]
    for v in verdicts:
        of_limit = v.get("of_limit")
        extra = (f" {of_limit:.2f} |" if of_limit is not None else " n/a |") if limit else ""
        lines.append(f"| {v['job']} | {v['best_peer']} | {v['ratio']:.2f} | "
                     f"{'yes' if v['p99_ok'] else 'no'} ({v['weir_p99_us']:.1f} vs {v['best_peer_p99_us']:.1f}) |{extra}")
    return "\n".join(lines), verdicts


def baseline_table(report):
    """weir / weir baseline per setting and job, from the same interleaved rounds."""
    lines = ["### weir / weir baseline", "", "| setting | job | IOPS ratio | p99 ratio |", "|---|---|---:|---:|"]
    for setting, data in report["settings"].items():
        results = data["results"]
        for job, new in results["weir"].items():
            old = results[BASELINE][job]
            lines.append(f"| {setting} | {job} | {new['iops'] / old['iops']:.2f} | "
                         f"{new['p99_us'] / max(old['p99_us'], 1e-9):.2f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runtime", type=int, default=int(os.environ.get("RUNTIME", 5)),
                        help="seconds per job and round")
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs of every job on every server, interleaved; the median is reported")
    parser.add_argument("--settings", default="memory,direct")
    parser.add_argument("--jobs", default=",".join(j[0] for j in JOBS),
                        help="comma-separated job names to run (default: the five above; also: "
                             + ", ".join(j[0] for j in EXTRA_JOBS) + ")")
    parser.add_argument("--dir", default=os.environ.get("BENCH_DIR", "/var/tmp"),
                        help="where the 2 GiB file for the direct setting lives (must allow O_DIRECT)")
    parser.add_argument("--baseline", metavar="WEIR_BIN",
                        help="also serve with this weir binary (an older build), reported as 'weir baseline' "
                             "with a weir / baseline table")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "peers"),
                        help="write OUT.json and OUT.md (default: bench/results/peers)")
    args = parser.parse_args()
    # Made now, so that a run of many minutes is not lost at its last step.
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    settings = args.settings.split(",")
    wanted = args.jobs.split(",")
    unknown = set(wanted) - {j[0] for j in JOBS + EXTRA_JOBS}
    if unknown:
        parser.error(f"unknown jobs: {', '.join(sorted(unknown))}")
    selected_jobs = [j for j in JOBS + EXTRA_JOBS if j[0] in wanted]
    tmp = tempfile.mkdtemp(prefix="weir-bench-")
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, kernel {platform.release()}",
              "command": "bench/peers.sh " + shlex.join(sys.argv[1:]), "runtime_s": args.runtime, "rounds": args.rounds, "settings": {}}
    markdown = []

    if "memory" in settings:
        print("== setting 1: server overhead, memory-backed", flush=True)
        shm = "/dev/shm/weir-bench-qemu.img"
        with open(shm, "wb") as f:
            f.truncate(SIZE)
        servers = Servers(tmp)
        try:
            servers.start("weir", lambda sock: [WEIR, "serve", "--listen", "none", "--socket", sock, "--export",
                                                "bench=mem:2G", "--log-level", "warn"])
            if args.baseline:
                servers.start(BASELINE, lambda sock: [args.baseline, "serve", "--listen", "none", "--socket", sock,
                                                      "--export", "bench=mem:2G", "--log-level", "warn"])
            servers.start("nbdkit", lambda sock: ["nbdkit", "-f", "-U", sock, "-e", "bench", "memory", "2G"])
            servers.start("qemu-nbd", lambda sock: ["qemu-nbd", "-k", sock, "-x", "bench", "-f", "raw", "-t",
                                                    "--shared=16", shm])
            results = run_interleaved(nbd_targets(servers), args.runtime, args.rounds, selected_jobs)
        finally:
            servers.stop()
            os.unlink(shm)
        text, verdicts = table("Setting 1: memory-backed", results, ["nbdkit", "qemu-nbd"])
        report["settings"]["memory"] = {"results": results, "verdicts": verdicts}
        markdown.append(text)
        print(text, flush=True)

    if "direct" in settings:
        print("== setting 2: direct I/O on a file", flush=True)
        path = os.path.join(args.dir, "weir-bench-direct.img")
        subprocess.run(["fio", "--name=prefill", "--ioengine=io_uring", "--direct=1", f"--filename={path}",
                        "--rw=write", "--bs=1M", "--iodepth=8", f"--size={SIZE}", "--output-format=terse"],
                       check=True, capture_output=True, timeout=900)
        servers = Servers(tmp)
        try:
            # All serve the same file at once; qemu's image locking would
            # refuse that, and only one of them runs a job at any moment.
            servers.start("weir", lambda sock: [WEIR, "serve", "--listen", "none", "--socket", sock, "--export",
                                                f"bench={path}", "--log-level", "warn"], prefill=False)
            if args.baseline:
                servers.start(BASELINE, lambda sock: [args.baseline, "serve", "--listen", "none", "--socket", sock,
                                                      "--export", f"bench={path}", "--log-level", "warn"],
                              prefill=False)
            servers.start("qemu-nbd", lambda sock: [
                "qemu-nbd", "-k", sock, "-x", "bench", "-t", "--shared=16", "--cache=none", "--aio=io_uring",
                "--image-opts", f"driver=raw,file.driver=file,file.filename={path},file.locking=off"],
                prefill=False)
            servers.start("qemu-storage-daemon", lambda sock: [
                "qemu-storage-daemon",
                "--blockdev", f"driver=file,node-name=file0,filename={path},cache.direct=on,aio=io_uring,locking=off",
                "--blockdev", "driver=raw,node-name=raw0,file=file0",
                "--nbd-server", f"addr.type=unix,addr.path={sock}",
                "--export", "type=nbd,id=exp0,node-name=raw0,name=bench,writable=on"], prefill=False)
            servers.start("nbdkit-file (page cache, reference)",
                          lambda sock: ["nbdkit", "-f", "-U", sock, "-e", "bench", "file", path, "cache=none"],
                          prefill=False)
            print("  io_uring limit: fio --ioengine=io_uring --direct=1 on the file", flush=True)
            targets = nbd_targets(servers)
            targets[LIMIT] = ["--ioengine=io_uring", "--direct=1", f"--filename={path}",
                                                      f"--size={SIZE}"]
            results = run_interleaved(targets, args.runtime, args.rounds, selected_jobs)
        finally:
            servers.stop()
            os.unlink(path)
        text, verdicts = table("Setting 2: direct I/O on a file", results, ["qemu-nbd", "qemu-storage-daemon"],
                               limit=LIMIT)
        report["settings"]["direct"] = {"results": results, "verdicts": verdicts}
        markdown.append(text)
        print(text, flush=True)

    if args.baseline:
        markdown.append(baseline_table(report))
        print(markdown[-1], flush=True)
    out = args.out + ".json"
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(f"Date: {report['date']}  \nMachine: {report['machine']}  \nCommand: `{report['command']}`\n\n")
        f.write("\n\n".join(markdown) + "\n")
    print(f"\nwrote {out}\nrerun: {report['command']}")


if __name__ == "__main__":
    main()
