#!/usr/bin/env bash
# Builds Release and runs the benchmarks of docs/benchmarks.md: ring_bench (ring round trip vs a
# SOCK_SEQPACKET ping-pong, batched no-ops, local write bandwidth vs memcpy), idle_cost (a
# sidecar with one idle client in adaptive mode) and, with --tcp, `tensorlane bench` (two
# sidecars over TCP on loopback vs plain TCP). Prints every figure as a ratio against the
# baseline measured in the same run, next to the goal.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/bench.sh [options]

  --build-dir DIR     build tree to use (default build/release, configured with the
                      release preset)
  --no-build          use the binaries already in the build tree
  --repetitions N     ring_bench repetitions; the summary takes the medians (default 3)
  --min-time S        ring_bench seconds per benchmark and repetition (default 0.5)
  --filter REGEX      only these ring_bench benchmarks (default: all)
  --idle-seconds N    idle_cost window (default 10)
  --tcp               also run `tensorlane bench` (two sidecars over TCP on loopback)
  --tcp-args "ARGS"   extra arguments for `tensorlane bench` (e.g. "--sizes 64-64M")
  --out DIR           keep the raw JSON outputs in DIR (default: a temp dir, removed)
  -h, --help          this text
USAGE
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$root/build/release"
build_given=0
do_build=1
repetitions=3
min_time=0.5
filter=""
idle_seconds=10
tcp=0
tcp_args=""
out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --build-dir) build=$(realpath -m "$2"); build_given=1; shift ;;
        --no-build) do_build=0 ;;
        --repetitions) repetitions=$2; shift ;;
        --min-time) min_time=$2; shift ;;
        --filter) filter=$2; shift ;;
        --idle-seconds) idle_seconds=$2; shift ;;
        --tcp) tcp=1 ;;
        --tcp-args) tcp_args=$2; shift ;;
        --out) out=$2; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
    shift
done

cd "$root"
if [ "$do_build" -eq 1 ]; then
    if [ "$build_given" -eq 0 ]; then
        cmake --preset release >/dev/null
    fi
    targets=(ring_bench idle_cost)
    if [ "$tcp" -eq 1 ]; then
        targets+=(tensorlane tensorlane-sidecar)
    fi
    cmake --build "$build" --target "${targets[@]}" -j "$(nproc)"
fi
if ! grep -q '^CMAKE_BUILD_TYPE:STRING=Release$' "$build/CMakeCache.txt" 2>/dev/null; then
    echo "bench.sh: warning: $build is not a Release build; figures will not be representative" >&2
fi

if [ -n "$out" ]; then
    mkdir -p "$out"
    work=$(cd "$out" && pwd)
    keep=1
else
    work=$(mktemp -d /tmp/tensorlane-bench-sh.XXXXXX)
    keep=0
fi
cleanup() {
    if [ "$keep" -eq 0 ]; then
        rm -rf "$work"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== $(date -Iseconds) on $(uname -n): $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"

ring_args=(--benchmark_format=json "--benchmark_out=$work/ring_bench.json"
    --benchmark_out_format=json "--benchmark_min_time=$min_time")
if [ "$repetitions" -gt 1 ]; then
    ring_args+=("--benchmark_repetitions=$repetitions" --benchmark_report_aggregates_only=true)
fi
if [ -n "$filter" ]; then
    ring_args+=("--benchmark_filter=$filter")
fi
echo "== ring_bench ${ring_args[*]}"
"$build/tests/bench/ring_bench" "${ring_args[@]}" >/dev/null

echo "== idle_cost --seconds $idle_seconds --mode adaptive"
"$build/tests/bench/idle_cost" --seconds "$idle_seconds" --mode adaptive >"$work/idle_cost.json"

if [ "$tcp" -eq 1 ]; then
    # shellcheck disable=SC2086 # --tcp-args is a list of words on purpose
    echo "== tensorlane bench --json $work/tcp_bench.json $tcp_args"
    # shellcheck disable=SC2086
    "$build/sidecar/tensorlane" bench --json "$work/tcp_bench.json" $tcp_args
fi

echo "== load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$work" <<'PY'
import json, os, sys

work = sys.argv[1]
with open(os.path.join(work, "ring_bench.json")) as f:
    ring = json.load(f)

# One entry per benchmark: the median aggregate when repeated, else the single run.
runs = {}
for b in ring["benchmarks"]:
    if b.get("error_occurred"):
        print(f"  {b['name']}: ERROR {b.get('error_message', '')}")
        continue
    name = b.get("run_name", b["name"])
    if b.get("run_type") == "aggregate":
        if b.get("aggregate_name") == "median":
            runs[name] = b
    else:
        runs.setdefault(name, b)

def get(name, key):
    b = runs.get(name + "/real_time")
    return None if b is None else b.get(key)

def verdict(ok):
    return "ok" if ok else "MISSED"

print("\n== summary (ratios against baselines measured in the same run)")
ring_p50, sock_p50 = get("RingNop", "p50_ns"), get("SeqpacketPingPong", "p50_ns")
if ring_p50 and sock_p50:
    ratio = sock_p50 / ring_p50
    print(f"ring round trip (no-op, busy-polling): p50 {ring_p50:.0f} ns, p99 "
          f"{get('RingNop', 'p99_ns'):.0f} ns, {get('RingNop', 'ops_per_s'):,.0f} ops/s")
    print(f"SOCK_SEQPACKET 64 B ping-pong:          p50 {sock_p50:.0f} ns, p99 "
          f"{get('SeqpacketPingPong', 'p99_ns'):.0f} ns, "
          f"{get('SeqpacketPingPong', 'ops_per_s'):,.0f} ops/s")
    print(f"  socket p50 / ring p50 = {ratio:.1f}x  (goal >= 10x: {verdict(ratio >= 10)})")
    raw_p50 = get("RingRaw", "p50_ns")
    if raw_p50:
        print(f"  the floor, the two rings alone (no sidecar, no shim): p50 {raw_p50:.0f} ns = "
              f"{sock_p50 / raw_p50:.1f}x below the socket; RingNop spends "
              f"{ring_p50 - raw_p50:.0f} ns more")

batches = sorted((int(n.split("/")[1]), b) for n, b in runs.items()
                 if n.startswith("RingNopBatch/"))
if batches:
    best = 0.0
    for size, b in batches:
        rate, p50 = b.get("ops_per_s", 0), b.get("ops_per_s_p50", 0)
        best = max(best, rate, p50)
        print(f"batched no-ops, batch {size:4d}: {rate / 1e6:6.2f} M/s mean, "
              f"{p50 / 1e6:6.2f} M/s at the median batch")
    print(f"  best {best / 1e6:.2f} M/s  (goal >= 5 M/s: {verdict(best >= 5e6)})")

sizes = sorted({int(n.split("/")[1]) for n in runs if n.startswith("Memcpy/")})
if sizes:
    modes = sorted({n.split("/")[1] for n in runs if n.startswith("LocalWrite/")})
    header = f"{'size':>9} {'memcpy GB/s':>12}"
    for m in modes:
        header += f" {m + ' GB/s':>15} {'ratio':>7}"
    print("\nlocal write vs memcpy (median-sample rates; goal >= 80% from 1 MiB up)")
    print(header)
    misses = []
    for size in sizes:
        mc = runs.get(f"Memcpy/{size}/real_time", {}).get("bytes_per_s_p50")
        label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
        line = f"{label:>9} {mc / 1e9 if mc else 0:12.2f}"
        for m in modes:
            w = runs.get(f"LocalWrite/{m}/{size}/real_time", {}).get("bytes_per_s_p50")
            if w and mc:
                r = w / mc
                line += f" {w / 1e9:15.2f} {100 * r:6.0f}%"
                if size >= 1 << 20 and r < 0.8:
                    misses.append(f"{label} {m}")
            else:
                line += f" {'-':>15} {'-':>7}"
        print(line)
    print("  goal: " + ("ok" if not misses else "MISSED for " + ", ".join(misses)))

with open(os.path.join(work, "idle_cost.json")) as f:
    idle = json.load(f)
pct = idle.get("sidecar_schedstat_core_pct", idle["sidecar_core_pct"])
print(f"\nidle sidecar ({idle['mode']}, one idle client, {idle['seconds']:.1f} s): "
      f"{pct:.3f}% of a core (ticks: {idle['sidecar_core_pct']:.2f}%), client "
      f"{idle['client_core_pct']:.2f}%  (goal < 2%: {verdict(pct < 2)})")

tcp = os.path.join(work, "tcp_bench.json")
if os.path.exists(tcp):
    with open(tcp) as f:
        t = json.load(f)
    print("\ntensorlane bench over TCP (see its table above):")
    for r in t["results"]:
        parts = [f"{r['bytes']:>10} B"]
        if "latency_p50_ratio" in r:
            parts.append(f"RTT p50 {r['latency']['p50_us']:.1f} us = "
                         f"{r['latency_p50_ratio']:.2f}x plain TCP "
                         f"(fastest: {r.get('latency_min_ratio', 0):.2f}x)")
        if "bandwidth_ratio" in r:
            parts.append(f"{r['bandwidth']['gbps']:.3f} GB/s = "
                         f"{100 * r['bandwidth_ratio']:.0f}% of one TCP stream")
        print("  " + ", ".join(parts))
    for goal, ok in t.get("goals_met", {}).items():
        print(f"  {goal}: {verdict(ok)}")
PY
if [ "$keep" -eq 1 ]; then
    echo "raw outputs in $work"
fi
