#!/usr/bin/env bash
# Mirror pool writes by connection count (1-32), CPU per GiB and server threads.
# Usage: bench/pool-scaling.sh [--runtime SECONDS] [--rounds N] [--jobs 1,2,...] [--baseline WEIR_BIN] [--cache MODE] [--out PREFIX]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
exec /usr/bin/python3 bench/pool_scaling.py "$@"
