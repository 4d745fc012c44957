#!/usr/bin/env bash
# Writers on two volumes that share weir's dirty budget: one on a slow disk
# keeps the budget full, the other's writes beside it against alone.
# Usage: bench/volumes.sh [--runtime SECONDS] [--out PREFIX]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
exec /usr/bin/python3 bench/volumes.py "$@"
