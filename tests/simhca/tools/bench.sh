#!/usr/bin/env bash
# The simulated HCA's speed against plain UDP on the same loopback, in one run: perftest's
# ib_write_lat and ib_write_bw between two simulated devices, and udp_baseline's ping-pong and
# stream between the same two addresses (docs/simhca.md, "Speed").
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: tests/simhca/tools/bench.sh [BUILD_DIR] [--iters N] [--sizes "65536 1048576 4194304"]
                                   [--rounds N]

BUILD_DIR defaults to build/release. Needs perftest (ib_write_lat, ib_write_bw).
Prints each measurement and the ratios: small-message one-way latency (perftest's t_typical
and t_avg, RTT/2) against UDP ping-pong, and bandwidth against a UDP stream of
path-MTU-sized datagrams. With --rounds N the bandwidth part runs N times, each round between
two UDP streams (its ratio is against their mean: the loopback's speed moves between runs),
and ends with the lowest and the median ratio per size.
USAGE
}

build=build/release
iters=5000
sizes="65536 1048576 4194304"
rounds=1
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds=${2:?}; shift 2 ;;
        --iters) iters=${2:?}; shift 2 ;;
        --sizes) sizes=${2:?}; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        -*) usage >&2; exit 2 ;;
        *) build=$1; shift ;;
    esac
done
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
simdir="$root/$build/tests/simhca"
udp="$simdir/tools/udp_baseline"
[ -x "$udp" ] || { echo "bench: build udp_baseline and simhca_ibverbs first" >&2; exit 2; }
tree=$(mktemp -d /tmp/simhca-bench-XXXXXX)
trap 'rm -rf "$tree"' EXIT
"$root/tests/simhca/tools/mksysfs.sh" "$tree" --dev sim0 --netdev bench0 --ip 127.0.0.2 --mtu 4200
"$root/tests/simhca/tools/mksysfs.sh" "$tree" --dev sim1 --netdev bench1 --ip 127.0.0.3 --mtu 4200

port=$((20000 + RANDOM % 10000))
perf_pair() {  # perf_pair PROGRAM ARGS...: server on sim0, client on sim1; prints the result row
    local prog=$1
    shift
    port=$((port + 1))
    TENSORLANE_SYSFS_ROOT=$tree LD_LIBRARY_PATH=$simdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$prog" -F -d sim0 -x 3 -p "$port" "$@" \
        >/dev/null 2>&1 &
    local srv=$!
    sleep 0.4
    TENSORLANE_SYSFS_ROOT=$tree LD_LIBRARY_PATH=$simdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$prog" -F -d sim1 -x 3 -p "$port" "$@" \
        127.0.0.1 2>/dev/null | grep -A1 '#bytes' | tail -n 1
    wait "$srv"
}

echo "== latency (one-way = RTT/2, usec), 8-byte messages, $iters iterations"
udp_line=$("$udp" pingpong --size 8 --iters "$iters" --a 127.0.0.2 --b 127.0.0.3)
echo "$udp_line"
udp_busy=$("$udp" pingpong --size 8 --iters "$iters" --a 127.0.0.2 --b 127.0.0.3 --busy)
echo "$udp_busy"
udp_cross=$("$udp" pingpong --size 8 --iters "$iters" --a 127.0.0.2 --b 127.0.0.3 --cross-cpu)
echo "$udp_cross"
lat=$(perf_pair ib_write_lat -n "$iters" -s 8)
echo "ib_write_lat: $lat"
field() { sed -E "s/.* $1 ([0-9.]+).*/\\1/" <<<"$2"; }
read -r _ _ _ _ lat_typ lat_avg _ <<<"$lat"
for base in "udp pingpong:$(field typical "$udp_line"):$(field avg "$udp_line")" \
    "udp pingpong cross-cpu:$(field typical "$udp_cross"):$(field avg "$udp_cross")"; do
    IFS=: read -r name ut ua <<<"$base"
    awk -v n="$name" -v lt="$lat_typ" -v la="$lat_avg" -v ut="$ut" -v ua="$ua" 'BEGIN {
        printf "ratio ib_write_lat / %s: typical %.1fx, average %.1fx (goal: 2x)\n",
               n, lt / ut, la / ua }'
done

echo "== bandwidth (MiB/s)"
udp_stream() {
    local line
    line=$("$udp" stream --size 4096 --bytes 2147483648 --a 127.0.0.2 --b 127.0.0.3)
    echo "$line" >&2
    sed -E 's/.*: ([0-9.]+) MiB\/s/\1/' <<<"$line"
}
ratios=$(mktemp /tmp/simhca-bench-ratios-XXXXXX)
trap 'rm -rf "$tree" "$ratios"' EXIT
udp_before=$(udp_stream)
for ((round = 1; round <= rounds; round++)); do
    declare -A got=()
    for s in $sizes; do
        n=$((1073741824 / s))
        [ "$n" -gt 5000 ] && n=5000
        [ "$n" -lt 100 ] && n=100
        bw=$(perf_pair ib_write_bw -n "$n" -s "$s")
        read -r _ _ _ bw_avg _ <<<"$bw"
        got[$s]=$bw_avg
    done
    udp_after=$(udp_stream)
    for s in $sizes; do
        awk -v r="$round" -v s="$s" -v b="${got[$s]}" -v u1="$udp_before" -v u2="$udp_after" 'BEGIN {
            u = (u1 + u2) / 2
            printf "round %d: ib_write_bw %8d bytes: %8.1f MiB/s = %3.0f%% of the UDP stream (%.1f MiB/s, mean of the two around it; goal: 50%% from 1 MiB)\n",
                   r, s, b, 100 * b / u, u }'
        awk -v s="$s" -v b="${got[$s]}" -v u1="$udp_before" -v u2="$udp_after" \
            'BEGIN { printf "%d %.1f\n", s, 200 * b / (u1 + u2) }' >>"$ratios"
    done
    unset got
    udp_before=$udp_after
done
if [ "$rounds" -gt 1 ]; then
    for s in $sizes; do
        awk -v s="$s" '$1 == s { print $2 }' "$ratios" | sort -n | awk -v s="$s" '
            { v[++n] = $1 }
            END {
                m = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
                printf "ib_write_bw %8d bytes over %d rounds: lowest %.0f%%, median %.0f%% of the UDP stream\n",
                       s, n, v[1], m }'
    done
fi
