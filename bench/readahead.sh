#!/usr/bin/env bash
# Readahead off vs on over readers x device models (real time).
# Usage: bench/readahead.sh [--runtime SECONDS] [--models hdd,ssd,nvme] [--rounds N] [--out PREFIX]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
exec /usr/bin/python3 bench/readahead.py "$@"
