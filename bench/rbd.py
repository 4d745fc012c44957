#!/usr/bin/python3
"""weir vs qemu-storage-daemon on RBD images of one Ceph cluster, and a
client reader beside an OSD's recovery.

A single-node cluster (scripts/ceph-cluster.sh: three OSDs on 10 GiB files,
pool size 2) holds one 1 GiB image per server, filled first. Servers:
- weir: `--export bench=rbd:rbd/IMAGE` (its write-back cache, the default);
- weir writethrough: the same with cache=writethrough;
- qemu-storage-daemon: its rbd driver (qemu-block-extra) with the cluster's
  defaults (librbd's own cache, writethrough until the first flush).
rbd-nbd needs the kernel's nbd module, which this machine lacks; it runs
where `modprobe nbd` works (--rbd-nbd).

Each fio job (nbd engine, Unix socket) runs on every server once per round,
interleaved as in bench/peers.py; the median round is reported.

Recovery, three cycles by default: osd.2 stops, 1 GiB is written to another
image (every object of it degraded), and osd.2 starts again; a 4 KiB QD1
random reader through weir runs while the cluster recovers, against the same
reader on the idle cluster just before. Beside it, at the same time, the same
reader runs straight on librbd (fio's rbd engine) on an image of its own: what
the cluster gives a client with no gateway, under the same recovery.
"""

import argparse
import concurrent.futures
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
from peers import Servers, fio, nbd_targets, run_interleaved, table  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WEIR = os.environ.get("WEIR_BIN", os.path.join(ROOT, "target/release/weir"))
SCRIPT = os.path.join(ROOT, "scripts/ceph-cluster.sh")
IMAGE_MIB = 1024
# The recovery cycles' reader with no gateway reads this image.
LIBRBD_IMAGE = "librbd"
JOBS = [  # name, rw, bs, iodepth
    ("randread-4k-qd1", "randread", "4k", 1),
    ("randread-4k-qd32", "randread", "4k", 32),
    ("randwrite-4k-qd1", "randwrite", "4k", 1),
    ("randwrite-4k-qd32", "randwrite", "4k", 32),
    ("seqread-1m-qd8", "read", "1M", 8),
    ("seqwrite-1m-qd8", "write", "1M", 8),
]


def sh(*cmd, timeout=600):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=timeout).stdout


def fill(uri):
    sh("fio", "--name=fill", "--ioengine=nbd", f"--uri={uri}", "--rw=write", "--bs=1M", "--iodepth=8",
       f"--size={IMAGE_MIB}M", "--output-format=terse")


def pg_states(conf):
    stat = json.loads(sh("ceph", "-c", conf, "pg", "stat", "-f", "json"))
    summary = stat.get("pg_summary", stat)
    return {s["name"]: s["num"] for s in summary.get("num_pg_by_state", [])}


def recovering(states):
    return any("recover" in name or "degraded" in name or "backfill" in name for name in states)


def wait_clean(conf, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        states = pg_states(conf)
        if set(states) == {"active+clean"}:
            return
        time.sleep(1)
    raise RuntimeError(f"cluster not clean after {timeout}s: {pg_states(conf)}")


def reader(uri, runtime):
    return fio(["--ioengine=nbd", f"--uri={uri}", "--rw=randread", "--bs=4k", "--iodepth=1",
                f"--size={IMAGE_MIB}M"], runtime)


def librbd_reader(image, runtime):
    """The same reader with no gateway: fio's rbd engine on librbd (CEPH_CONF names the cluster)."""
    return fio(["--ioengine=rbd", "--clientname=admin", "--pool=rbd", f"--rbdname={image}", "--rw=randread",
                "--bs=4k", "--iodepth=1", f"--size={IMAGE_MIB}M"], runtime)


def readers(uri, runtime):
    """weir's reader and the librbd reader, at the same time."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        weir = pool.submit(reader, uri, runtime)
        direct = pool.submit(librbd_reader, LIBRBD_IMAGE, runtime)
        return weir.result(), direct.result()


def recovery_run(conf, cluster_dir, uri, runtime, cycle):
    """The readers idle, then beside recovery; returns both and the states seen."""
    wait_clean(conf)
    idle, idle_librbd = readers(uri, runtime)
    sh(SCRIPT, "stop-osd", cluster_dir, "2")
    time.sleep(3)
    image = f"rbd/degraded{cycle}"
    sh("rbd", "-c", conf, "create", "--size", f"{IMAGE_MIB}M", image)
    sh("rbd", "-c", conf, "bench", "--io-type", "write", "--io-size", "4M", "--io-threads", "8",
       "--io-total", f"{IMAGE_MIB}M", "--io-pattern", "seq", image, timeout=900)
    sh(SCRIPT, "start-osd", cluster_dir, "2")
    before = pg_states(conf)
    started = time.time()
    during, during_librbd = readers(uri, runtime)
    after = pg_states(conf)
    wait_clean(conf, timeout=900)
    clean_s = time.time() - started
    # The next cycle's degraded writes need the room.
    sh("rbd", "-c", conf, "rm", image)
    return {"idle": idle, "recovery": during, "states_at_start": before, "states_at_end": after,
            "recovery_s": clean_s, "p99_ratio": during["p99_us"] / idle["p99_us"],
            "librbd_idle": idle_librbd, "librbd_recovery": during_librbd,
            "librbd_p99_ratio": during_librbd["p99_us"] / idle_librbd["p99_us"]}


def median_of(cycles, key):
    ratios = sorted(c[key] for c in cycles)
    return f"{ratios[len(ratios) // 2]:.2f} (cycles: {', '.join(f'{r:.2f}' for r in ratios)})"


def recovery_table(cycles):
    lines = ["### A 4 KiB QD1 reader through weir beside an OSD's recovery", "",
             "Each cycle: the readers on the idle cluster, then osd.2 stops, 1 GiB is written to a new "
             "image, osd.2 starts and the readers run again at once. Two readers run at the same time, "
             "each on its own image: one through weir, one straight on librbd (fio's rbd engine), so "
             "that the second shows what recovery does to a client of the cluster with no gateway.", "",
             "| cycle | reader | idle IOPS | idle p50 us | idle p99 us | recovering IOPS | recovering p50 us | "
             "recovering p99 us | recovering max us | p99 recovering / idle | clean after s |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for index, c in enumerate(cycles, 1):
        for name, i, r, ratio in (("weir", c["idle"], c["recovery"], c["p99_ratio"]),
                                  ("librbd", c["librbd_idle"], c["librbd_recovery"], c["librbd_p99_ratio"])):
            lines.append(f"| {index} | {name} | {i['iops']:.0f} | {i['p50_us']:.0f} | {i['p99_us']:.0f} | "
                         f"{r['iops']:.0f} | {r['p50_us']:.0f} | {r['p99_us']:.0f} | {r['max_us']:.0f} | "
                         f"{ratio:.2f} | {c['recovery_s']:.0f} |")
    lines += ["", f"Median p99 beside recovery / idle: through weir {median_of(cycles, 'p99_ratio')}; "
              f"straight on librbd {median_of(cycles, 'librbd_p99_ratio')}. Placement groups when each "
              "recovering run started: " + "; ".join(str(c["states_at_start"]) for c in cycles) + "."]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runtime", type=int, default=5, help="seconds per job and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--recovery-runtime", type=int, default=20,
                        help="seconds of the reader, idle and beside recovery")
    parser.add_argument("--recovery-cycles", type=int, default=3,
                        help="times the OSD stops, misses writes and recovers")
    parser.add_argument("--rbd-nbd", action="store_true", help="also rbd-nbd (needs the kernel nbd module)")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "rbd"))
    args = parser.parse_args()
    # Made now, so that a run of many minutes is not lost at its last step.
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="weir-bench-rbd-")
    cluster_dir = os.path.join(tmp, "ceph")
    conf = os.path.join(cluster_dir, "ceph.conf")
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, kernel {platform.release()}",
              "command": "bench/rbd.sh " + shlex.join(sys.argv[1:]), "runtime_s": args.runtime,
              "rounds": args.rounds}
    print(f"== cluster: {SCRIPT} start {cluster_dir}", flush=True)
    # Four images of 1 GiB, two copies each, and 1 GiB more for recovery.
    os.environ.setdefault("CEPH_OSD_SIZE", "10G")
    sh(SCRIPT, "start", cluster_dir)
    servers = Servers(tmp)
    try:
        os.environ["CEPH_CONF"] = conf
        for image in ("weir", "weirwt", "qsd", LIBRBD_IMAGE):
            sh("rbd", "-c", conf, "create", "--size", f"{IMAGE_MIB}M", f"rbd/{image}")
        weir_log = ["--log-level", "warn", "--data-dir", os.path.join(tmp, "data")]
        servers.start("weir", lambda sock: [WEIR, "serve", "--listen", "none", "--socket", sock, *weir_log,
                                            "--export", f"bench=rbd:rbd/weir,conf={conf}"], prefill=False)
        servers.start("weir writethrough", lambda sock: [
            WEIR, "serve", "--listen", "none", "--socket", sock, "--log-level", "warn",
            "--data-dir", os.path.join(tmp, "data-wt"),
            "--export", f"bench=rbd:rbd/weirwt,conf={conf},cache=writethrough"], prefill=False)
        servers.start("qemu-storage-daemon", lambda sock: [
            "qemu-storage-daemon",
            "--blockdev", f"driver=rbd,node-name=rbd0,pool=rbd,image=qsd,conf={conf},user=admin",
            "--nbd-server", f"addr.type=unix,addr.path={sock}",
            "--export", "type=nbd,id=exp0,node-name=rbd0,name=bench,writable=on"], prefill=False)
        if args.rbd_nbd:
            raise SystemExit("--rbd-nbd: not wired here; it needs /dev/nbd*, which this kernel lacks")
        for uri in servers.uris.values():
            fill(uri)
        sh("fio", "--name=fill", "--ioengine=rbd", "--clientname=admin", "--pool=rbd", f"--rbdname={LIBRBD_IMAGE}",
           "--rw=write", "--bs=1M", "--iodepth=8", f"--size={IMAGE_MIB}M", "--output-format=terse")
        results = run_interleaved(nbd_targets(servers), args.runtime, args.rounds, JOBS)
        text, verdicts = table("weir vs qemu-storage-daemon on RBD", results, ["qemu-storage-daemon"])
        report["results"], report["verdicts"] = results, verdicts
        print(text, flush=True)
        print("== reader beside recovery", flush=True)
        cycles = [recovery_run(conf, cluster_dir, servers.uris["weir"], args.recovery_runtime, cycle)
                  for cycle in range(args.recovery_cycles)]
        report["recovery"] = cycles
        recovery_text = recovery_table(cycles)
        print(recovery_text, flush=True)
    finally:
        servers.stop()
        subprocess.run([SCRIPT, "stop", cluster_dir], timeout=120, check=False)
        subprocess.run(["rm", "-rf", tmp], check=False)
    with open(args.out + ".json", "w") as f:
        json.dump(report, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(f"Date: {report['date']}  \nMachine: {report['machine']}  \nCommand: `{report['command']}`\n\n")
        f.write(text + "\n\n" + recovery_text + "\n")
    print(f"\nwrote {args.out}.md\nrerun: {report['command']}")


if __name__ == "__main__":
    main()
