#!/usr/bin/env bash
# The write-back cache against write-through: write IOPS on a file and the
# device models, and a random reader beside a sequential writer.
# Usage: bench/cache.sh [--runtime SECONDS] [--rounds N] [--targets file,hdd,ssd,nvme] [--parts writes,reader] [--out PREFIX]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
exec /usr/bin/python3 bench/cache.py "$@"
