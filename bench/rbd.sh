#!/usr/bin/env bash
# weir vs qemu-storage-daemon on RBD images of a single-node Ceph cluster, and
# a reader beside an OSD's recovery. Needs ceph-mon ceph-mgr ceph-osd ceph-common qemu-block-extra.
# Usage: bench/rbd.sh [--runtime SECONDS] [--rounds N] [--recovery-runtime SECONDS] [--recovery-cycles N] [--out PREFIX]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
exec /usr/bin/python3 bench/rbd.py "$@"
