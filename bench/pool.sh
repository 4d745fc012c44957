#!/usr/bin/env bash
# weir pool volumes vs raw volumes (and qemu-nbd) under the same fio jobs.
# Usage: bench/pool.sh [--runtime SECONDS] [--rounds N] [--settings files,nvme] [--dir DIR] [--baseline WEIR_BIN] [--out PREFIX]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
exec /usr/bin/python3 bench/pool.py "$@"
