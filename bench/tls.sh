#!/usr/bin/env bash
# NBD over TLS vs plaintext: weir, nbdkit and qemu-nbd, nbdcopy as the client.
# Usage: bench/tls.sh [--rounds N] [--out PREFIX]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
exec /usr/bin/python3 bench/tls.py "$@"
