#!/usr/bin/env bash
# Run every fuzz target for SECONDS each (default 20) over its corpus in
# fuzz/corpus/, which grows with what the run finds. Exits non-zero on the
# first crash; libFuzzer leaves the input in fuzz/artifacts/TARGET/.
#
#   scripts/fuzz.sh            # each target 10 s, no sanitizer (the test suite's run)
#   scripts/fuzz.sh 600        # each target 10 minutes
#   scripts/fuzz.sh 600 pool   # one target
#
# cargo-fuzz needs nightly features; RUSTC_BOOTSTRAP lets the stable
# toolchain build them. Reproduce a crash with
#   RUSTC_BOOTSTRAP=1 cargo fuzz run -O TARGET fuzz/artifacts/TARGET/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(handshake request volume cache pool)
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked --quiet
export RUSTC_BOOTSTRAP=1
# Short runs skip AddressSanitizer, which doubles the build; longer ones
# use it (weir has unsafe code around io_uring and aligned buffers).
sanitizer=address
[ "$seconds" -ge 60 ] || sanitizer=none
cargo fuzz build -O -s "$sanitizer"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for target in "${targets[@]}"; do
  mkdir -p "fuzz/corpus/$target"
  echo "== fuzz $target for ${seconds} s"
  if ! cargo fuzz run -O -s "$sanitizer" "$target" "fuzz/corpus/$target" -- \
      -max_total_time="$seconds" -max_len=8192 -len_control=0 -print_final_stats=1 >"$log" 2>&1; then
    tail -40 "$log" >&2
    echo "fuzz target $target failed; the input is in fuzz/artifacts/$target/" >&2
    exit 1
  fi
  grep -E '^stat::(number_of_executed_units|peak_rss_mb)' "$log" | tr '\n' ' '
  echo
done
