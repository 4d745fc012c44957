#!/usr/bin/python3
"""The write-back cache against write-through, served side by side.

Part "writes": one weir with --cache writeback and one with --cache
writethrough, each exporting a file on the same disk and the HDD, SATA
SSD and NVMe device models; fio's nbd engine runs each job on each pair,
interleaved over rounds. Write-back IOPS are given twice: during the run,
and counting the FLUSH after it (the cache's debt is paid inside the
figure), so a cache that only defers work does not look faster.

Part "reader": on each device model, a 4 KiB random reader at QD1 alone,
then beside a 1 MiB sequential writer at QD8 (both fio, same export, one
connection each), in both modes: the reader's p99 over its p99 alone,
and the writer's throughput.
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

import nbd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import FIO_COMMON, WEIR, fio, wait_for_socket  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SIZE = 1 << 30
MODES = ["writeback", "writethrough"]
TARGETS = {  # export name: device spec (file: is filled in per server)
    "file": None,
    "hdd": f"model:hdd,size={SIZE}",
    "ssd": f"model:ssd,size={SIZE}",
    "nvme": f"model:nvme,size={SIZE}",
}
WRITE_JOBS = [  # name, rw, bs, iodepth
    ("randwrite-4k-qd1", "randwrite", "4k", 1),
    ("randwrite-4k-qd8", "randwrite", "4k", 8),
    ("write-64k-qd1", "write", "64k", 1),
    ("write-1m-qd8", "write", "1M", 8),
]


def serve(tmp, mode, weir):
    sock = os.path.join(tmp, f"{mode}.sock")
    path = os.path.join(tmp, f"{mode}.img")
    with open(path, "wb") as f:
        f.truncate(SIZE)
    exports = []
    for name, spec in TARGETS.items():
        exports += ["--export", f"{name}={spec or 'file:' + path}"]
    cmd = [weir, "serve", "--listen", "none", "--socket", sock, "--admin", "none", "--log-level", "warn",
           "--cache", mode, *exports]
    print("  " + shlex.join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_socket(sock, proc, timeout=60)
    return proc, sock


def uri(sock, export):
    return f"nbd+unix:///{export}?socket={sock}"


def flush_seconds(sock, export):
    h = nbd.NBD()
    h.connect_uri(uri(sock, export))
    start = time.monotonic()
    h.flush()
    elapsed = time.monotonic() - start
    h.shutdown()
    return elapsed


def fill(sock, export):
    subprocess.run(["fio", "--name=fill", "--ioengine=nbd", f"--uri={uri(sock, export)}", "--rw=write",
                    "--bs=1M", "--iodepth=8", f"--size={SIZE}", "--output-format=terse"],
                   check=True, capture_output=True, timeout=900)
    flush_seconds(sock, export)


def write_runs(servers, targets, runtime, rounds):
    results = []
    turn = 0
    for target in targets:
        for job, rw, bs, depth in WRITE_JOBS:
            runs = {mode: [] for mode in servers}
            for _ in range(rounds):
                order = MODES[turn % 2:] + MODES[:turn % 2]
                turn += 1
                for mode in order:
                    sock = servers[mode]
                    r = fio(["--ioengine=nbd", f"--uri={uri(sock, target)}", f"--rw={rw}", f"--bs={bs}",
                             f"--iodepth={depth}", f"--size={SIZE}"], runtime)
                    flush = flush_seconds(sock, target)
                    r["iops_with_flush"] = r["iops"] * runtime / (runtime + flush)
                    r["flush_s"] = flush
                    runs[mode].append(r)
                    print(f"    {target:5} {job:17} {mode:12} {r['iops']:9.0f} IOPS "
                          f"({r['iops_with_flush']:9.0f} with its flush, {flush:5.2f} s) "
                          f"p99 {r['p99_us']:8.0f} us", flush=True)
            cell = {"target": target, "job": job}
            for mode, rs in runs.items():
                cell[mode] = sorted(rs, key=lambda r: r["iops_with_flush"])[len(rs) // 2]
            results.append(cell)
    return results


def reader_runs(servers, targets, runtime):
    reader = ["--rw=randread", "--bs=4k", "--iodepth=1", f"--size={SIZE}"]
    results = []
    for target in targets:
        for mode, sock in servers.items():
            alone = fio(["--ioengine=nbd", f"--uri={uri(sock, target)}", *reader], runtime)
            box = {}

            def write():
                box["writer"] = fio(["--ioengine=nbd", f"--uri={uri(sock, target)}", "--rw=write", "--bs=1M",
                                     "--iodepth=8", f"--size={SIZE}"], runtime)

            writer = threading.Thread(target=write)
            writer.start()
            time.sleep(0.5)  # the writer is under way before the reader starts
            beside = fio(["--ioengine=nbd", f"--uri={uri(sock, target)}", *reader], runtime - 1)
            writer.join()
            flush_seconds(sock, target)
            cell = {"target": target, "mode": mode, "alone": alone, "beside": beside, "writer": box["writer"]}
            print(f"    {target:5} {mode:12} reader p99 alone {alone['p99_us']:8.0f} us, beside the writer "
                  f"{beside['p99_us']:8.0f} us ({beside['p99_us'] / max(alone['p99_us'], 1):5.2f}x); "
                  f"writer {box['writer']['mb_s']:7.1f} MB/s", flush=True)
            results.append(cell)
    return results


def tables(report):
    lines = [f"Command: `{report['command']}`  ", f"Machine: {report['machine']}  ", f"Date: {report['date']}", ""]
    lines += ["IOPS during the run, then counting the FLUSH after it (its seconds in brackets); the ratio is of"
              " the latter. A drive model with a write cache of its own (the HDD) is paid for in that FLUSH"
              " in both modes.", "",
              "| target | job | write-back IOPS | with its flush | write-through IOPS | with its flush | ratio |"
              " write-back p99 us | write-through p99 us |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for c in report["writes"]:
        wb, wt = c["writeback"], c["writethrough"]
        lines.append(f"| {c['target']} | {c['job']} | {wb['iops']:.0f} | {wb['iops_with_flush']:.0f} "
                     f"({wb['flush_s']:.1f} s) | {wt['iops']:.0f} | {wt['iops_with_flush']:.0f} "
                     f"({wt['flush_s']:.1f} s) | {wb['iops_with_flush'] / max(wt['iops_with_flush'], 1e-9):.2f} | "
                     f"{wb['p99_us']:.0f} | {wt['p99_us']:.0f} |")
    lines += ["", "| device | mode | reader p99 alone us | beside a 1 MiB QD8 writer us | ratio | writer MB/s |",
              "|---|---|---:|---:|---:|---:|"]
    for c in report["reader"]:
        ratio = c["beside"]["p99_us"] / max(c["alone"]["p99_us"], 1e-9)
        lines.append(f"| {c['target']} | {c['mode']} | {c['alone']['p99_us']:.0f} | {c['beside']['p99_us']:.0f} | "
                     f"{ratio:.2f} | {c['writer']['mb_s']:.1f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runtime", type=int, default=10, help="seconds per fio run")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of each write job (median)")
    parser.add_argument("--targets", default=",".join(TARGETS), help="exports to run: file,hdd,ssd,nvme")
    parser.add_argument("--parts", default="writes,reader", help="writes, reader or both")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "cache"),
                        help="write OUT.json and OUT.md (default: bench/results/cache)")
    args = parser.parse_args()
    # Made now, so that a run of many minutes is not lost at its last step.
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    targets = args.targets.split(",")
    parts = args.parts.split(",")
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, kernel {platform.release()}",
              "command": "bench/cache.sh " + shlex.join(sys.argv[1:]), "writes": [], "reader": []}
    tmp = tempfile.mkdtemp(prefix="weir-cache-", dir="/var/tmp")
    procs = []
    try:
        servers = {}
        for mode in MODES:
            proc, sock = serve(tmp, mode, WEIR)
            procs.append(proc)
            servers[mode] = sock
        if "file" in targets and "writes" in parts:
            for sock in servers.values():
                fill(sock, "file")
        if "writes" in parts:
            report["writes"] = write_runs(servers, targets, args.runtime, args.rounds)
        if "reader" in parts:
            report["reader"] = reader_runs(servers, [t for t in targets if t != "file"], args.runtime)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=300)
        subprocess.run(["rm", "-rf", tmp])
    text = tables(report)
    print(text)
    with open(args.out + ".json", "w") as f:
        json.dump(report, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write("### Write-back cache against write-through\n\n" + text + "\n")
    print(f"wrote {args.out}.json\nrerun: {report['command']}")


if __name__ == "__main__":
    main()
