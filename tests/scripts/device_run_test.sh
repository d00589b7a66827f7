#!/usr/bin/env bash
# scripts/device-run.sh's dry run (nothing is built or run): each --nccl-bench list's leading
# NAME=VALUE words go into that run's environment, the rest are the bench's arguments.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cd "$root"
out="$(scripts/device-run.sh run --dry-run --no-gpu --no-rest --out "$tmp/out" \
    --nccl-bench "TENSORLANE_TCP_BUSY_CUT=65536 TENSORLANE_TAG_READ_FROM=16384 --sizes none \
--allreduce 1048576 --tag-threads 8; --sizes 4096 --modes 1" 2>&1)"
fail() {
    echo "FAIL: $1" >&2
    echo "$out" >&2
    exit 1
}
bench=build/release/tests/bench/nccl_plugin_bench
grep -qE "would run: timeout [0-9]+ env TENSORLANE_TCP_BUSY_CUT=65536 \
TENSORLANE_TAG_READ_FROM=16384 $bench --sizes none --allreduce 1048576 --tag-threads 8$" \
    <<<"$out" || fail "the first run's environment and arguments"
grep -qE "would run: timeout [0-9]+ env $bench --sizes 4096 --modes 1$" <<<"$out" ||
    fail "the second run: no environment, its arguments"
[ "$(grep -c "would run: .*nccl_plugin_bench" <<<"$out")" -eq 2 ] || fail "two runs"
echo "device-run.sh --nccl-bench: environments and arguments as given"
