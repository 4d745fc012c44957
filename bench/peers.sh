#!/usr/bin/env bash
# weir vs qemu-nbd, qemu-storage-daemon and nbdkit under the same fio jobs.
# Usage: bench/peers.sh [--runtime SECONDS] [--rounds N] [--settings memory,direct] [--jobs NAME,...] [--dir DIR] [--baseline WEIR_BIN] [--out PREFIX]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
exec /usr/bin/python3 bench/peers.py "$@"
