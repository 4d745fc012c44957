#!/usr/bin/python3
"""Run weir's benchmarks and write docs/benchmarks.md (servers and pools) and
docs/scenarios.md (the device-model scenarios) from their results.

Usage: scripts/benchmarks.py [--only peers,tls,pool,pool-scaling,cache,volumes,readahead,rbd,writeback-matrix,readahead-depth-matrix,calibrate,scheduler,mirror-reads,...]
                             [--real] [--compose-only]

Each benchmark writes its current result under bench/results/ (JSON and a
Markdown table with the command, machine and date that produced it); the
page is then put together from every result there, so refreshing one
benchmark keeps the others' tables. --real adds the real-time (through NBD)
runs of the scenarios, which take about half an hour more.
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
MODELS = os.path.join(RESULTS, "models")
WEIR = os.path.join(ROOT, "target", "release", "weir")
PAGE = os.path.join(ROOT, "docs", "benchmarks.md")
SCENARIO_PAGE = os.path.join(ROOT, "docs", "scenarios.md")

SCENARIOS = {  # name: (weir bench arguments, what it shows)
    "calibrate": (["calibrate"], "each device model alone against the figures it is built to give"),
    "scheduler": (["scheduler", "--seconds", "60", "--seed", "1"],
                  "the device queue's modes with a scrub beside random readers on HDD, SSD and NVMe mirrors, and the matrix of foreground loads beside a scrub and a resilver"),
    "mirror-reads": (["mirror-reads"], "the mirror read policies on mixed, equal and slowing copies"),
    "scrub-vs-randread": (["scrub-vs-randread"], "a sequential scrub starving random reads on one HDD (fifo)"),
    "readahead": (["readahead"], "readers of every kind on HDD, SSD and NVMe models with readahead off and on"),
    "streams": (["streams"], "one and two QD1 64 KiB streams on the HDD model through 1, 4 and 16 connections each, "
                "readahead off and on (the thread-pool storage target's collapse)"),
    "writeback-vs-randread": (["writeback-vs-randread"],
                              "a 1 MiB writer beside a 4 KiB random reader through the write-back cache, "
                              "under no throttle, Linux wbt and weir's adaptive queue, on HDD, SSD and NVMe"),
}


def machine():
    return f"{platform.machine()}, {os.cpu_count()} CPUs, kernel {platform.release()}"


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def run(cmd, log=None):
    """Run `cmd` from the repository; its output goes to `log`, or to ours."""
    print("+ " + shlex.join(cmd), flush=True)
    if log is None:
        return subprocess.run(cmd, cwd=ROOT).returncode
    with open(log, "w") as out:
        return subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT).returncode


def last_table(text):
    """The last Markdown table in a command's output: a scenario's checks."""
    tables, current = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    if current:
        tables.append(current)
    return "\n".join(tables[-1]) if tables else ""


def scenario_tail(text):
    """A scenario's reference notes and checks: what it prints after the
    last stream histogram, up to its rerun line."""
    lines = text.splitlines()
    start = 0
    for i, line in enumerate(lines):
        if "latency, log2 histogram" in line:
            start = i + 2
    end = next((i for i, line in enumerate(lines) if line.startswith("rerun:")), len(lines))
    tail = "\n".join(lines[start:end]).strip()
    return tail or last_table(text)


def run_scenario(name, mode):
    args, _ = SCENARIOS[name]
    cmd = [WEIR, "bench", *args, f"--{mode}", "--out", MODELS]
    log = os.path.join(MODELS, f"{name}-{mode}.log")
    code = run(cmd, log)
    with open(log) as f:
        output = f.read()
    os.unlink(log)
    shown = ["weir", "bench", *args, f"--{mode}", "--out", "bench/results/models"]
    with open(os.path.join(MODELS, f"{name}-{mode}.md"), "w") as f:
        f.write(f"Date: {now()}  \nMachine: {machine()}  \nCommand: `{shlex.join(shown)}`  \n"
                f"Exit status: {code}\n\n{scenario_tail(output)}\n")
    return code


# Why a scenario's real-time figures differ from its virtual-time ones.
SIDE_BY_SIDE_NOTES = {
    "scheduler": """Where they differ, and why:

- HDD runs: a served pool exports a 2 GiB volume on each 64 GiB model, so
  the real-time random reader seeks within 2 GiB while the simulated one
  seeks across the whole model. Its IOPS are higher and its p99 lower alone
  and beside a scrub, and the ratios built on them move with them: the
  adaptive queue serves the cheaper reads more often than zfs's fixed
  limits do, and the scrub beside it gives up that time, so "scrub,
  adaptive / zfs" falls below its simulated value. Scrub rates alone, set
  by the models' sequential rate, agree within about 20%; the real scrub
  is the pool's own, over the volume's written chunks.
- SSD and NVMe runs: every request crosses fio's NBD engine, a Unix socket
  and a server thread on the same 2 vCPUs as the models' timers. A QD1 read
  takes a few hundred microseconds more than the model's latency, and at
  QD32 client and server fill both CPUs at 50-60k IOPS where the models
  allow 166k (SSD) and 406k (NVMe). The flash checks then measure the
  host's CPUs: the scrub's checksumming and copies take CPU time from the
  reader's requests, which the simulator, with free CPUs, does not model.""",
    "mirror-reads": """Where they differ, and why:

- Random reads at depth stop at the CPUs in real time (client and server
  on 2 vCPUs, about 50-65k IOPS through one connection, 20k per connection
  with four), so every random cell reads a fraction of its simulated rate,
  and policies that differ in virtual time by how they spread random reads
  over the copies look alike. The checks on random reads fail for that.
- Sequential 1 MiB reads: cells bound by an SSD agree within a few
  percent; cells that the simulator runs at the NVMe models' combined rate
  (3-6 GB/s) stop near 3 GB/s in real time, where copying the data into
  the socket fills the CPUs.
- `pid` picks a copy from the reader's identity, and the simulated reader
  and the real connection land on different copies: the one-connection
  sequential reader is on the NVMe copy in virtual time and on the SSD copy
  in real time.
- HDD: the served volume is 2 GiB at the start of each 64 GiB model, so both
  readers run at the outer zone's rate in real time, where the simulated
  reader b reads the slower inner zone.""",
}


def p99(stream):
    """A stream's p99 in us, or a dash where none was measured (a served
    pool's own scrub reports its rate only)."""
    value = stream["latency_us"]["p99"]
    return f"{value:.0f}" if value else "-"


def sim_vs_real(name):
    """Each stream's figures in real time beside its simulated ones, from
    the two JSON reports of scenario `name`; None unless both exist."""
    reports = {}
    for mode in ("sim", "real"):
        path = os.path.join(MODELS, f"{name}-{mode}.json")
        if not os.path.exists(path):
            return None
        with open(path) as f:
            reports[mode] = {(run["label"], stream["name"]): stream
                             for run in json.load(f)["runs"] for stream in run["streams"]}
    lines = ["| run | stream | IOPS sim | IOPS real | real / sim | MB/s sim | MB/s real | p99 us sim | p99 us real |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for key, sim in reports["sim"].items():
        real = reports["real"].get(key)
        if real is None:
            continue
        ratio = real["iops"] / sim["iops"] if sim["iops"] else float("nan")
        lines.append(f"| {key[0]} | {key[1]} | {sim['iops']:.0f} | {real['iops']:.0f} | {ratio:.2f} | "
                     f"{sim['mb_per_s']:.1f} | {real['mb_per_s']:.1f} | "
                     f"{p99(sim)} | {p99(real)} |")
    return "\n".join(lines)


def section(path, heading, text):
    if not os.path.exists(path):
        return f"## {heading}\n\n{text}\n\nNo result yet: run `scripts/benchmarks.py`.\n"
    with open(path) as f:
        body = f.read().strip()
    # Result files start at level-3 headings; keep them under this section.
    return f"## {heading}\n\n{text}\n\n{body}\n"


def compose():
    parts = ["""# Benchmarks

Every table here is the current result of one benchmark, with the command
that reproduces it, the machine and the date. `scripts/benchmarks.py` runs
them all and rewrites this page (`--only NAME,...` refreshes some and keeps
the others' tables). Figures from a shared 2-CPU machine drift by tens of
percent over minutes, so the benchmarks that compare servers run them side
by side, interleave their jobs in rounds, and report the median round with
the spread; compare ratios within one table, not absolute figures across
tables.
"""]
    parts.append(section(os.path.join(RESULTS, "peers.md"), "Peers: weir vs qemu-nbd, qemu-storage-daemon and nbdkit",
                         """The same fio jobs (nbd engine, Unix socket, `--invalidate=0 --randrepeat=0 --norandommap
--time_based`) against every server of a setting. Memory-backed: weir `mem:2G`,
nbdkit's memory plugin, qemu-nbd on a file in `/dev/shm`, each filled with data
first. Direct I/O: one pre-written 2 GiB file served by all at once with
O_DIRECT and io_uring where the server offers it (nbdkit's file plugin uses the
page cache and is shown for reference), plus fio's own io_uring engine on the
file as the limit. Each job runs on every server once per round in a rotating
order. weir runs with its defaults: its write-back cache answers writes before
the file has them, and its readahead reads the file ahead of a sequential
reader in larger requests than the reader's, which is how a weir cell can pass
the limit fio reaches with the same job's requests."""))
    parts.append(section(os.path.join(RESULTS, "tls.md"), "NBD over TLS against plaintext",
                         """weir, nbdkit and qemu-nbd, each memory-backed and filled with data first, on
loopback TCP; weir and nbdkit take plaintext and TLS clients on one port
(`--tls on`), qemu-nbd runs once per mode. nbdcopy on one connection copies the
whole export to `null:` (reads) or from a file in `/dev/shm` (writes) at each
job's request size and depth; its own TLS (GnuTLS) shares the 2 CPUs with the
server's. Each job runs on every target once per round in a rotating order.
The kernel here offers no kTLS (no `tls` ULP), so encryption is rustls's in
weir, GnuTLS's in the peers."""))
    parts.append(section(os.path.join(RESULTS, "pool.md"), "Pools: mirrored, checksummed volumes vs raw",
                         """A 2-way mirror pool volume on two files against a raw export of one file (and
qemu-nbd on it), all on the same disk; then a mirror of two `model:nvme`
devices against one, where 1 MiB sequential reads should use both copies.
Writes to a mirror go to both copies and wait for both, so up to half the raw
write rate is expected when the disk is the limit. Where a baseline build is
shown, it is commit 08887e8 (every pool write on a pool of up to 64 threads that
each waited for the devices), served beside the current build in the same
rounds."""))
    parts.append(section(os.path.join(RESULTS, "pool-scaling.md"), "Pools: writes by connection count",
                         """A 2-way mirror pool whose members are files in `/dev/shm`, so the server's own
dispatch is what is measured: fio's nbd engine with N jobs (N connections),
each writing its own region, 128 KiB sequential writes at QD1 and 4 KiB random
writes at QD32. The server's CPU seconds per GiB written come from /proc (user
+ system), its thread count from the middle of each run: weir's own threads,
and apart from them the kernel's io_uring workers (`iou-wrk`), which the
kernel starts for writes it cannot issue without blocking (tmpfs files) and
ends when idle. Where a baseline build is shown, it is the last build whose
pool ran every write on a pool of up to 64 threads that each waited for the
devices (commit 08887e8), served beside the current one in the same rounds."""))
    parts.append(section(os.path.join(RESULTS, "pool-scaling-writethrough.md"),
                         "Pools: writes by connection count, written through",
                         """The same runs with the current build's volumes in `--cache writethrough`, so that
both builds answer a write once both copies have it: the pool's dispatch alone,
without the write-back cache's copy and pacing."""))
    parts.append(section(os.path.join(RESULTS, "cache.md"), "Write-back cache against write-through",
                         """Two servers side by side, one with `--cache writeback` (the default) and one with
`--cache writethrough`, each exporting a file on the same disk and 1 GiB HDD,
SATA SSD and NVMe device models in real time. Write jobs (fio's nbd engine)
run interleaved over rounds; the write-back IOPS are also given counting the
FLUSH after each run, so that deferred work is paid for inside the figure.
Then a 4 KiB random reader at QD1 runs alone and beside a 1 MiB sequential
writer at QD8 on the same export: the reader's p99 beside the writer over its
p99 alone, and the writer's throughput."""))
    parts.append(section(os.path.join(RESULTS, "volumes.md"), "Two volumes sharing the dirty budget",
                         """One weir with a 64 MiB dirty budget serves a volume on the HDD model,
where a 1 MiB QD8 sequential writer keeps the budget full, and a volume on the
SATA SSD or NVMe model, whose write jobs run alone and then beside that
writer. The budget is the server's; while both volumes write, the one
holding the most leaves an eighth of it to the other, and when it is full
room goes first to the waiting writes of the volume that holds the least
of it ([architecture.md](architecture.md)). "beside / alone" is the fast volume's
IOPS beside the slow writer over its IOPS alone."""))
    parts.append(section(os.path.join(RESULTS, "readahead.md"), "Readahead off and on",
                         """One weir serves a 4 GiB HDD, SATA SSD or NVMe model in real time, once with
`--readahead off` and once with `--readahead on` (the default). fio's nbd
engine runs random and sequential readers on it; a libnbd client runs two
64 KiB QD1 sequential streams, each sending its requests round-robin over four
connections. Last, `weir bench run --uri` drives one such stream beside a
64 KiB QD1 random reader in the other half (the two `stream+randread` rows:
each reader's MB/s). Rounds alternate off and on; the table gives the
medians and the range of the per-round ratios, since in real time on a
shared machine a cell can move by a third between identical runs. The
streams run after the fio jobs, on the same server. Each stream reads one half of the device, and a
disk's inner half reads slower than its outer one, so the lines under the
table judge the streams against the mean of both halves' sequential rates
(1 MiB QD8 from the start and from the middle, readahead off), as the
virtual-time scenario does. The same readers and more, in virtual time where
a run repeats exactly: `weir bench readahead` in [scenarios.md](scenarios.md)."""))
    parts.append(section(os.path.join(RESULTS, "read-pieces-matrix.md"), "Large reads whole and in pieces",
                         """With structured replies weir reads a large request in pieces and sends each
as a chunk as it lands ([architecture.md](architecture.md)). The matrix runs
fio's nbd engine against two builds on the same device, one that answers
every read whole and this one, each cell on a fresh server of each: random
and sequential readers at QD1 and QD8, 128 KiB to 4 MiB, on the device
models and a file. It needs the other build, so `scripts/benchmarks.py`
does not run it: build a weir from before reads went in pieces and run
`bench/read_pieces_matrix.py PATH-TO-THAT-WEIR 3 > bench/results/read-pieces-matrix.md`.
Identical runs move a cell by 10-15% here."""))
    parts.append(section(os.path.join(RESULTS, "rbd.md"), "Ceph RBD: weir vs qemu-storage-daemon",
                         """A single-node Ceph cluster (`scripts/ceph-cluster.sh`: one monitor, one
manager, three OSDs with BlueStore on files, pool `rbd` with two copies) on
the same machine as the servers and fio. Each server serves its own 1 GiB
image, filled first: weir with its write-back cache (the default) and with
`cache=writethrough`, and qemu-storage-daemon's rbd driver with the
cluster's defaults (librbd's cache, writethrough until the first flush).
The fio jobs run interleaved in rounds as for the other peers. rbd-nbd needs
the kernel's nbd module, which this machine lacks. Then a 4 KiB QD1 random
reader through weir runs on the idle cluster, and again right after an OSD
that missed 1 GiB of writes starts again and recovers them. The same reader
runs straight on librbd at the same time, on an image of its own: the ratio
recovery costs a client of the cluster with no gateway in front."""))
    parts.append("""## More

- The device-model scenarios (calibration, the pathologies, the device
  queue's modes, the mirror read policies): [scenarios.md](scenarios.md).
- How the device queue's modes work: [scheduler.md](scheduler.md); the
  mirror read policies: [mirror-reads.md](mirror-reads.md); the device
  models: [devices.md](devices.md).
""")
    write(PAGE, parts)
    scenario_parts = ["""# Scenarios

The current result of each `weir bench` scenario in virtual time: the
seeded simulator runs the same device queues, read selector and device
models as `weir serve`, so these figures repeat exactly for the same seed
and build. `scripts/benchmarks.py` reruns them and rewrites this page
(`--real` adds the real-time runs through NBD). Each scenario's checks
compare measured figures with expected ranges; what the figures mean is in
[scheduler.md](scheduler.md), [mirror-reads.md](mirror-reads.md) and
[devices.md](devices.md). Server and pool benchmarks are in
[benchmarks.md](benchmarks.md).
"""]
    for name, (_, what) in SCENARIOS.items():
        for mode in ("sim", "real"):
            path = os.path.join(MODELS, f"{name}-{mode}.md")
            if mode == "real" and not os.path.exists(path):
                continue
            label = "virtual time" if mode == "sim" else "real time through NBD"
            scenario_parts.append(section(path, f"`weir bench {name}`, {label}",
                                          f"Shows {what}. The JSON report and its plot are in "
                                          f"bench/results/models/."))
        side_by_side = sim_vs_real(name) if os.path.exists(os.path.join(MODELS, f"{name}-real.md")) else None
        if side_by_side:
            notes = SIDE_BY_SIDE_NOTES.get(name, "")
            scenario_parts.append(f"### `weir bench {name}`: real time beside virtual time\n\n"
                                  "Each stream of each run, from the two reports above.\n\n"
                                  f"{side_by_side}\n\n{notes}\n")
    scenario_parts.append(section(os.path.join(RESULTS, "writeback-matrix.md"),
                                  "Writeback throttles over a matrix, virtual time",
                                  """`bench/writeback_matrix.py`: on each device model, each reader alone and
beside each writer through the write-back cache under each writeback
throttle (`--wb-throttle none|wbt|adaptive`, see [bench.md](bench.md)).
Readers: 4 KiB random at QD1 and QD8, 64 KiB random at QD4, and an open-loop
4 KiB reader at half the IOPS the QD1 reader gets alone. Writers: 1 MiB
sequential at QD8, 64 KiB random at QD4, 128 KiB sequential at QD1. Each
cell: the reader's p99 over its p99 alone, and the writer's MB/s, each the
median over three seeds."""))
    scenario_parts.append(section(os.path.join(RESULTS, "readahead-depth-matrix.md"),
                                  "Readahead by block size and queue depth, virtual time",
                                  """`bench/readahead_depth_matrix.py`: on each device model, sequential
readers through one and four connections and random readers through one,
with blocks of 4 KiB-1 MiB at queue depths 1-16, each with readahead off
and on, the device queue in the adaptive mode `weir serve` runs a raw
export in with its defaults. A one-at-a-time reader's read-ahead is
background I/O there, below client reads. A client that keeps several
sequential reads in flight has them read ahead in larger reads when a
trial measures that faster, and those windows go as client reads: they
stand for reads it would have sent itself (see
[configuration.md](configuration.md#readahead)). Random readers read
nothing ahead; the lowest cell per reader is listed under the table. A
fast reader goes round its 4 GiB device more than once in a run, and on
the next pass what is still held from the last is
answered from memory: that is how a few NVMe cells pass the model's
3200 MB/s (the 1 MiB QD8 reader reads 3198 MB/s either way over one
second)."""))
    write(SCENARIO_PAGE, scenario_parts)


def write(path, parts):
    with open(path, "w") as f:
        f.write("\n".join(parts))
    print(f"wrote {os.path.relpath(path, ROOT)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    everything = ",".join(dict.fromkeys(
        ["peers", "tls", "pool", "pool-scaling", "cache", "volumes", "readahead", "rbd", "writeback-matrix",
         "readahead-depth-matrix", *SCENARIOS]))
    parser.add_argument("--only", default=everything, help=f"benchmarks to run (default: {everything})")
    parser.add_argument("--real", action="store_true", help="also run the scenarios in real time")
    parser.add_argument("--compose-only", action="store_true", help="only rewrite the page from the results")
    args = parser.parse_args()
    wanted = args.only.split(",")
    unknown = set(wanted) - set(everything.split(","))
    if unknown:
        parser.error(f"unknown benchmarks: {', '.join(sorted(unknown))}")
    failed = 0
    if not args.compose_only:
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
        os.makedirs(MODELS, exist_ok=True)
        if "peers" in wanted:
            failed += run(["bench/peers.sh", "--out", "bench/results/peers"]) != 0
        if "tls" in wanted:
            failed += run(["bench/tls.sh", "--out", "bench/results/tls"]) != 0
        if "pool" in wanted:
            failed += run(["bench/pool.sh", "--out", "bench/results/pool"]) != 0
        if "pool-scaling" in wanted:
            failed += run(["bench/pool-scaling.sh", "--out", "bench/results/pool-scaling"]) != 0
            failed += run(["bench/pool-scaling.sh", "--cache", "writethrough",
                           "--out", "bench/results/pool-scaling-writethrough"]) != 0
        if "cache" in wanted:
            failed += run(["bench/cache.sh", "--out", "bench/results/cache"]) != 0
        if "volumes" in wanted:
            failed += run(["bench/volumes.sh", "--out", "bench/results/volumes"]) != 0
        if "readahead" in wanted:
            failed += run(["bench/readahead.sh", "--out", "bench/results/readahead"]) != 0
        if "rbd" in wanted:
            failed += run(["bench/rbd.sh", "--out", "bench/results/rbd"]) != 0
        if "writeback-matrix" in wanted:
            failed += run(["bench/writeback_matrix.py"]) != 0
        if "readahead-depth-matrix" in wanted:
            failed += run(["bench/readahead_depth_matrix.py"]) != 0
        for name in SCENARIOS:
            if name in wanted:
                # A scenario's exit status is in its table: missed checks
                # are results, not a failure of this script.
                run_scenario(name, "sim")
                if args.real:
                    run_scenario(name, "real")
    compose()
    if failed:
        print(f"{failed} benchmark(s) failed; their tables are the previous results", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
