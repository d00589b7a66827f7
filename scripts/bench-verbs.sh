#!/usr/bin/env bash
# tensorlane's verbs transport against perftest on the same two simulated RoCE devices, in one
# run (docs/benchmarks.md, "Issue 10"): builds the simulated HCA's device tree (sim0, sim1 on
# two loopback addresses), then alternates rounds of perftest's ib_write_lat / ib_write_bw and
# `tensorlane bench --transport verbs` between the same two devices, and prints the ratios:
#   - the 64-byte write-to-notification round trip through two sidecars (p50) against
#     ib_write_lat's round trip (2 x its t_typical, which is the median of RTT/2);
#   - write bandwidth through the sidecars against ib_write_bw's BW average, from 64 KiB up.
# The same production binaries as always; the simulator is swapped in with LD_LIBRARY_PATH.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/bench-verbs.sh [options]

  --build-dir DIR     build tree (default build/release, configured with the release preset)
  --no-build          use the binaries already in the build tree
  --rounds N          alternating rounds of perftest and tensorlane bench (default 3)
  --iters N           latency round trips per round, both tools (default 3000)
  --lat-size BYTES    latency message size (default 64)
  --sizes "S ..."     bandwidth sizes in bytes (default "65536 262144 1048576 4194304")
  --bw-bytes BYTES    bytes each bandwidth measurement moves, both tools (default 1 GiB;
                      at least 200 writes)
  --window N          writes in flight in the bandwidth test, both tools: perftest's
                      --tx-depth and `tensorlane bench --window` (default 128)
  --qps N             QPs: perftest's -q and the sidecars' qps_per_peer (default 2, the
                      sidecar's default)
  --poll-mode MODE    the sidecars' [ipc] poll_mode: busy, adaptive or event, or a list
                      "busy adaptive" to measure each (default "busy adaptive")
  --sidecar NAME=PATH  compare this tensorlane-sidecar binary too (repeatable; each runs in
                      every round, alternating with the others; default: the build's, as
                      "tensorlane")
  --skip-lat, --skip-bw  leave that part out
  --out DIR           keep the raw outputs (perftest text, bench JSON) in DIR
  -h, --help          this text

Needs perftest (ib_write_lat, ib_write_bw) and python3. Run as root where possible: the
simulator's engine thread then runs real-time (docs/simhca.md, "Speed").
USAGE
}

die() {
    echo "bench-verbs.sh: $*" >&2
    exit 2
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$root/build/release"
build_given=0
do_build=1
rounds=3
iters=3000
lat_size=64
sizes="65536 262144 1048576 4194304"
bw_bytes=$((1 << 30))
window=128
qps=2
modes="busy adaptive"
do_lat=1
do_bw=1
out=""
variants=()
while [ $# -gt 0 ]; do
    case "$1" in
        --build-dir) build=$(realpath -m "${2:?}"); build_given=1; shift ;;
        --no-build) do_build=0 ;;
        --rounds) rounds=${2:?}; shift ;;
        --iters) iters=${2:?}; shift ;;
        --lat-size) lat_size=${2:?}; shift ;;
        --sizes) sizes=${2:?}; shift ;;
        --bw-bytes) bw_bytes=${2:?}; shift ;;
        --window) window=${2:?}; shift ;;
        --qps) qps=${2:?}; shift ;;
        --poll-mode) modes=${2:?}; shift ;;
        --sidecar)
            [[ ${2:?} =~ ^[A-Za-z0-9_.-]+=.+$ ]] || die "--sidecar NAME=PATH, not '$2'"
            [ -x "${2#*=}" ] || die "--sidecar: ${2#*=} is not executable"
            variants+=("$2"); shift ;;
        --skip-lat) do_lat=0 ;;
        --skip-bw) do_bw=0 ;;
        --out) out=${2:?}; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
    shift
done
for n in "$rounds" "$iters" "$lat_size" "$bw_bytes" "$window" "$qps"; do
    [[ $n =~ ^[0-9]+$ && $n -gt 0 ]] || die "expected a positive integer, got '$n'"
done
for s in $sizes; do
    [[ $s =~ ^[0-9]+$ && $s -gt 0 ]] || die "--sizes: expected byte counts, got '$s'"
done
for m in $modes; do
    case "$m" in busy|adaptive|event) ;; *) die "--poll-mode: busy, adaptive or event, not '$m'" ;; esac
done
for prog in ib_write_lat ib_write_bw python3; do
    command -v "$prog" >/dev/null || die "$prog is not installed (apt-get install perftest python3)"
done

cd "$root"
if [ "$do_build" -eq 1 ]; then
    if [ "$build_given" -eq 0 ]; then
        cmake --preset release >/dev/null
    fi
    cmake --build "$build" --target simhca_ibverbs tensorlane tensorlane-sidecar -j 2
fi
simdir="$build/tests/simhca"
tl="$build/sidecar/tensorlane"
[ -e "$simdir/libibverbs.so.1" ] || die "no simulated HCA in $simdir (build simhca_ibverbs)"
[ -x "$tl" ] || die "no $tl (build tensorlane and tensorlane-sidecar)"
if [ "${#variants[@]}" -eq 0 ]; then
    variants=("tensorlane=$build/sidecar/tensorlane-sidecar")
fi
labels=""
for v in "${variants[@]}"; do
    labels+="${labels:+ }${v%%=*}"
done
if ! grep -q '^CMAKE_BUILD_TYPE:STRING=Release$' "$build/CMakeCache.txt" 2>/dev/null; then
    echo "bench-verbs.sh: warning: $build is not a Release build; figures will not be representative" >&2
fi

if [ -n "$out" ]; then
    mkdir -p "$out"
    work=$(cd "$out" && pwd)
    keep=1
else
    work=$(mktemp -d /tmp/tensorlane-bench-verbs.XXXXXX)
    keep=0
fi
tree="$work/sys"
rm -rf "$tree"
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do
        kill "$p" 2>/dev/null || true
    done
    if [ "$keep" -eq 0 ]; then
        rm -rf "$work"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Two simulated devices on loopback addresses of their own (derived from our pid, so two runs
# or a test on the same host do not take each other's UDP port 4791).
net="127.$((1 + ($$ >> 8) % 250)).$(($$ % 250))"
"$root/tests/simhca/tools/mksysfs.sh" "$tree" --dev sim0 --netdev tlbench0 --ip "$net.2" --mtu 4200 >/dev/null
"$root/tests/simhca/tools/mksysfs.sh" "$tree" --dev sim1 --netdev tlbench1 --ip "$net.3" --mtu 4200 >/dev/null
export TENSORLANE_SYSFS_ROOT="$tree"
sim_env=(env "LD_LIBRARY_PATH=$simdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")

port=$((20000 + RANDOM % 10000))
# perftest PROGRAM OUTFILE ARGS...: its server on sim0, its client on sim1 (towards sim0's
# address); the client's report goes to OUTFILE. GID index 3 is the IPv4 RoCE v2 GID of the tree.
perftest() {
    local prog=$1 file=$2 srv rc=0
    shift 2
    port=$((port + 1))
    "${sim_env[@]}" "$prog" -F -d sim0 -x 3 -p "$port" "$@" >"$file.server" 2>&1 &
    srv=$!
    pids+=("$srv")
    sleep 0.5
    "${sim_env[@]}" timeout 120 "$prog" -F -d sim1 -x 3 -p "$port" "$@" "$net.2" >"$file" 2>&1 || rc=$?
    wait "$srv" || rc=$?
    pids=()
    if [ "$rc" -ne 0 ]; then
        echo "bench-verbs.sh: $prog $* failed ($rc):" >&2
        cat "$file" "$file.server" >&2
        exit 1
    fi
}

# tlbench SIDECAR ARGS...: tensorlane bench on the same two devices; node-a is sim0, node-b sim1.
tlbench() {
    local sidecar=$1
    shift
    "${sim_env[@]}" "$tl" bench --transport verbs --sysfs-root "$tree" --devices sim0,sim1 \
        --qps "$qps" --no-baseline --sidecar "$sidecar" "$@"
}

echo "== $(date -Iseconds) on $(uname -n): $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== devices sim0 ($net.2) and sim1 ($net.3) in $tree; $rounds rounds; poll modes: $modes"
for r in $(seq 1 "$rounds"); do
    if [ "$do_lat" -eq 1 ]; then
        echo "-- round $r: ib_write_lat -s $lat_size -n $iters"
        perftest ib_write_lat "$work/lat.perftest.$r.txt" -s "$lat_size" -n "$iters"
        for m in $modes; do
            for v in "${variants[@]}"; do
                echo "-- round $r: tensorlane bench --test lat --sizes $lat_size --poll-mode $m (${v%%=*})"
                tlbench "${v#*=}" --test lat --sizes "$lat_size" --iters "$iters" --duration 30 \
                    --poll-mode "$m" --json "$work/lat.$m.${v%%=*}.$r.json" >/dev/null
            done
        done
    fi
    if [ "$do_bw" -eq 1 ]; then
        list=""
        for s in $sizes; do
            n=$((bw_bytes / s))
            [ "$n" -lt 200 ] && n=200
            echo "-- round $r: ib_write_bw -s $s -n $n -q $qps -t $window"
            perftest ib_write_bw "$work/bw.perftest.$s.$r.txt" -s "$s" -n "$n" -q "$qps" -t "$window"
            list+="${list:+,}$s"
        done
        for m in $modes; do
            for v in "${variants[@]}"; do
                # One second per size: about as long as perftest's --bw-bytes take on the simulator.
                echo "-- round $r: tensorlane bench --test bw --sizes $list --poll-mode $m (${v%%=*})"
                tlbench "${v#*=}" --test bw --sizes "$list" --window "$window" --duration 1 \
                    --poll-mode "$m" --json "$work/bw.$m.${v%%=*}.$r.json" >/dev/null
            done
        done
    fi
done
echo "== load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$work" "$rounds" "$lat_size" "$sizes" "$modes" "$do_lat" "$do_bw" "$labels" <<'PY'
import json, os, statistics, sys

work, rounds, lat_size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sizes = [int(s) for s in sys.argv[4].split()]
labels = sys.argv[8].split()
# Every (poll mode, sidecar) pair measured; named by the mode alone with one sidecar.
modes = [(m, v) for m in sys.argv[5].split() for v in labels]
def name(mv):
    return mv[0] if len(labels) == 1 else f"{mv[1]}/{mv[0]}"
do_lat, do_bw = sys.argv[6] == "1", sys.argv[7] == "1"
LAT_GOAL, BW_GOAL = 1.3, 0.90

def perftest_row(path):
    """The numbers of the row after perftest's '#bytes' header line."""
    lines = open(path).read().splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("#bytes") and i + 1 < len(lines):
            return [float(x) for x in lines[i + 1].split()]
    raise SystemExit(f"no result row in {path}")

def load(path):
    with open(path) as f:
        return json.load(f)

def verdict(ok):
    return "met" if ok else "MISSED"

print("\n== summary: ratios against perftest on the same two simulated devices, same run")
if do_lat:
    # ib_write_lat: #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%, in usec,
    # each half a round trip (perftest reports RTT/2). Its RTT is twice t_typical (the median).
    perf = [perftest_row(os.path.join(work, f"lat.perftest.{r}.txt")) for r in range(1, rounds + 1)]
    perf_rtt = [2 * p[4] for p in perf]
    print(f"\n{lat_size} B round trip, p50 (us): ib_write_lat = 2 x t_typical (its median of RTT/2);"
          " tensorlane = write -> peer worker notified -> echo written -> notified")
    print("  ib_write_lat RTT per round: " + ", ".join(f"{x:.1f}" for x in perf_rtt) +
          f"  (t_avg x2: " + ", ".join(f"{2 * p[5]:.1f}" for p in perf) + ")")
    for mv in modes:
        m = name(mv)
        tl = [load(os.path.join(work, f"lat.{mv[0]}.{mv[1]}.{r}.json"))["results"][0]["latency"]
              for r in range(1, rounds + 1)]
        ratios = [t["p50_us"] / p for t, p in zip(tl, perf_rtt)]
        med = statistics.median(t["p50_us"] for t in tl) / statistics.median(perf_rtt)
        parts = tl[-1]
        split = ""
        if "a_to_b_p50_us" in parts:
            split = (f"; last round's parts: A->B {parts['a_to_b_p50_us']:.1f}, B turn "
                     f"{parts['b_turn_p50_us']:.1f}, B->A {parts['b_to_a_p50_us']:.1f}")
        print(f"  tensorlane ({m}) RTT p50 per round: " +
              ", ".join(f"{t['p50_us']:.1f}" for t in tl) + split)
        print(f"  ratio ({m}): {med:.2f}x (median over median; per round " +
              ", ".join(f"{x:.2f}x" for x in ratios) + f")  goal <= {LAT_GOAL}x: "
              f"{verdict(med <= LAT_GOAL)}")
if do_bw:
    print("\nbandwidth, MiB/s (2^20 bytes/s): ib_write_bw's BW average vs completed writes "
          "through the sidecars (each a write that landed and was notified at the peer)")
    print(f"{'size':>9} {'ib_write_bw':>12}" +
          "".join(f" {name(m) + ' MiB/s':>15} {'ratio':>7}" for m in modes))
    ok = {m: True for m in modes}
    for s in sizes:
        perf = statistics.median(
            perftest_row(os.path.join(work, f"bw.perftest.{s}.{r}.txt"))[3]
            for r in range(1, rounds + 1))
        label = f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB"
        line = f"{label:>9} {perf:12.1f}"
        for m in modes:
            rates = []
            for r in range(1, rounds + 1):
                for row in load(os.path.join(work, f"bw.{m[0]}.{m[1]}.{r}.json"))["results"]:
                    if row["bytes"] == s:
                        rates.append(row["bandwidth"]["gbps"] * 1e9 / (1 << 20))
            mine = statistics.median(rates)
            ratio = mine / perf
            if s >= 65536 and ratio < BW_GOAL:
                ok[m] = False
            line += f" {mine:15.1f} {100 * ratio:6.0f}%"
        print(line)
    for m in modes:
        print(f"  {name(m)}: goal >= {100 * BW_GOAL:.0f}% of ib_write_bw from 64 KiB up: "
              f"{verdict(ok[m])}")
PY
if [ "$keep" -eq 1 ]; then
    echo "raw outputs in $work"
fi
