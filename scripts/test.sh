#!/usr/bin/env bash
# The one test command: installs what it needs, then fmt, clippy, unit and
# integration tests. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

need_packages=()
for pair in nbdinfo:libnbd-bin nbdcopy:libnbd-bin nbdfuse:libnbd-bin fio:fio nbdkit:nbdkit \
            qemu-img:qemu-utils qemu-io:qemu-utils fusermount3:fuse3 mkfs.ext4:e2fsprogs losetup:mount \
            openssl:openssl promtool:prometheus curl:curl \
            ceph-mon:ceph-mon ceph-mgr:ceph-mgr ceph-osd:ceph-osd rbd:ceph-common; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need_packages+=("${pair#*:}")
done
/usr/bin/python3 -c 'import nbd' 2>/dev/null || need_packages+=(python3-libnbd)
if [ ${#need_packages[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "test.sh: missing ${need_packages[*]}; run as root or install them" >&2
    exit 1
  fi
  echo "== installing ${need_packages[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # qemu-system-common is not needed (qemu-storage-daemon ships with qemu-utils
  # on current Debian) and conflicts with backported qemu-utils, so it is not listed.
  apt-get install -y -qq "${need_packages[@]}" >/dev/null
fi

echo "== cargo fmt --check (at ${SECONDS}s)"
cargo fmt --all -- --check
echo "== module layout: no import circles (at ${SECONDS}s)"
/usr/bin/python3 scripts/import-graph.py
echo "== cargo clippy (at ${SECONDS}s)"
cargo clippy --all-targets -- -D warnings
# Unit tests in the release profile, which keeps overflow checks: with
# line-table debug info it builds faster than the test profile, and the
# integration tests' binary then shares most of that build.
echo "== unit tests (at ${SECONDS}s)"
cargo test --all --release
echo "== pool torture test: 2000 more seeds (at ${SECONDS}s)"
WEIR_SIM_FIRST=1000 WEIR_SIM_SEEDS=2000 cargo test --release -p weir --lib every_seed_keeps_flushed_data
echo "== write-back cache torture test: 5000 seeds (at ${SECONDS}s)"
WEIR_CACHE_SEEDS=5000 cargo test --release -p weir --lib every_seed_keeps_flushed_writes
echo "== fuzz targets, briefly (at ${SECONDS}s; scripts/fuzz.sh 600 runs each for ten minutes)"
scripts/fuzz.sh 10
echo "== building the release binary for integration tests (at ${SECONDS}s)"
cargo build --release
export WEIR_BIN="$PWD/target/release/weir"
echo "== integration tests (at ${SECONDS}s; real clients against $WEIR_BIN)"
cd tests/integration
# libnbd's python module lives in Debian's python, not in pyenv's.
# Every test_*.py here, so that a new file is never left out.
PYENV_VERSION=system /usr/bin/python3 -W ignore::ResourceWarning -m unittest discover -v -s . -p 'test_*.py'
echo "== all tests passed (in ${SECONDS}s)"
