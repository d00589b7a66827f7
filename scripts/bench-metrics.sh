#!/usr/bin/env bash
# What the Prometheus endpoint costs the data path: two pairs of sidecars on loopback, one pair
# with [metrics] listen (writes timed, scraped every --scrape-ms while the bench runs) and one
# without, measured in alternation by `tensorlane bench` attached to each pair. Prints, per
# size, the medians over the rounds of the round-trip p50 and the bandwidth, and on/off ratios.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/bench-metrics.sh [options]

  --build-dir DIR   build tree with tensorlane and tensorlane-sidecar (default build/release)
  --rounds N        alternating rounds, metrics off then on (default 5)
  --sizes LIST      `tensorlane bench --sizes` (default 64,64K,4M)
  --duration S      seconds per measurement (default 1)
  --poll-mode M     [ipc] poll_mode of all four sidecars: busy, adaptive, event (default busy)
  --scrape-ms MS    scrape both "on" sidecars this often during the runs (default 1000; 0: never)
  --out DIR         keep the configs, logs and JSON results in DIR (default: a temp dir, removed)
  -h, --help        this text
USAGE
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$root/build/release"
rounds=5
sizes="64,64K,4M"
duration=1
poll_mode=busy
scrape_ms=1000
out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --build-dir) build=$(realpath -m "$2"); shift ;;
        --rounds) rounds=$2; shift ;;
        --sizes) sizes=$2; shift ;;
        --duration) duration=$2; shift ;;
        --poll-mode) poll_mode=$2; shift ;;
        --scrape-ms) scrape_ms=$2; shift ;;
        --out) out=$2; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench-metrics: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
    shift
done
cli="$build/sidecar/tensorlane"
sidecar="$build/sidecar/tensorlane-sidecar"
for b in "$cli" "$sidecar"; do
    [ -x "$b" ] || { echo "bench-metrics: $b is missing (build first)" >&2; exit 1; }
done

if [ -n "$out" ]; then
    mkdir -p "$out"
    dir=$(realpath "$out")
else
    dir=$(mktemp -d "${TMPDIR:-/tmp}/tl-bench-metrics.XXXXXX")
fi
pids=()
cleanup() {
    for p in "${pids[@]}"; do
        kill "$p" 2>/dev/null || true
    done
    for p in "${pids[@]}"; do
        wait "$p" 2>/dev/null || true
    done
    [ -n "$out" ] || rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

"$cli" keygen "$dir/peer.key" >/dev/null
declare -A metrics_port
# One config: $1 variant (off|on), $2 this node, $3 its port, $4 the peer, $5 the peer's port.
write_config() {
    local v=$1 me=$2 port=$3 peer=$4 peer_port=$5
    {
        printf '[node]\nname = "%s"\nlisten = "127.0.0.1:%s"\nsocket = "%s/%s-%s.sock"\n' \
            "$me" "$port" "$dir" "$me" "$v"
        printf '[ipc]\npoll_mode = "%s"\n' "$poll_mode"
        printf '[fabric]\ntransport = "tcp"\n'
        printf '[security]\npeer_key_file = "%s/peer.key"\n' "$dir"
        if [ "$v" = on ]; then
            printf '[metrics]\nlisten = "127.0.0.1:%s"\n' "${metrics_port[$me-$v]}"
        fi
        printf '[[peers]]\nname = "%s"\naddress = "127.0.0.1:%s"\n' "$peer" "$peer_port"
    } >"$dir/$me-$v.toml"
}
for v in off on; do
    pa=$(free_port)
    pb=$(free_port)
    metrics_port[node-a-$v]=$(free_port)
    metrics_port[node-b-$v]=$(free_port)
    write_config "$v" node-a "$pa" node-b "$pb"
    write_config "$v" node-b "$pb" node-a "$pa"
    for n in node-a node-b; do
        "$sidecar" --config "$dir/$n-$v.toml" --log-level warn 2>"$dir/$n-$v.log" &
        pids+=($!)
    done
done
for v in off on; do
    for n in node-a node-b; do
        for _ in $(seq 100); do
            [ -S "$dir/$n-$v.sock" ] && break
            sleep 0.05
        done
        [ -S "$dir/$n-$v.sock" ] || { echo "bench-metrics: $n ($v) did not start:" >&2; cat "$dir/$n-$v.log" >&2; exit 1; }
    done
done

# GET /metrics with bash's /dev/tcp (no curl needed); the answer on stdout.
scrape() {
    local port=$1
    exec 3<>"/dev/tcp/127.0.0.1/$port"
    printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3
    cat <&3
    exec 3>&-
}
if [ "$scrape_ms" -gt 0 ]; then
    (
        interval=$(awk "BEGIN { print $scrape_ms / 1000 }")
        while :; do
            scrape "${metrics_port[node-a-on]}" >/dev/null || true
            scrape "${metrics_port[node-b-on]}" >/dev/null || true
            sleep "$interval"
        done
    ) &
    pids+=($!)
fi

echo "bench-metrics: $rounds rounds, sizes $sizes, $duration s each, poll mode $poll_mode," \
    "scrapes every ${scrape_ms} ms on the metrics pair ($(nproc) CPUs)"
for r in $(seq "$rounds"); do
    for v in off on; do
        "$cli" bench --socket "$dir/node-a-$v.sock" --peer node-b \
            --peer-socket "$dir/node-b-$v.sock" --sizes "$sizes" --duration "$duration" \
            --iters 100000 --no-baseline --json "$dir/$v-$r.json" >/dev/null 2>"$dir/bench-$v-$r.log" ||
            { echo "bench-metrics: bench ($v, round $r) failed:" >&2; cat "$dir/bench-$v-$r.log" >&2; exit 1; }
    done
    echo "bench-metrics: round $r of $rounds done"
done
if [ "$scrape_ms" -gt 0 ]; then
    scraped=$(scrape "${metrics_port[node-a-on]}" | awk '/^exposer_scrapes_total/ {print $2}')
    echo "bench-metrics: node-a (metrics on) was scraped ${scraped:-?} times"
fi

python3 - "$dir" "$rounds" <<'PY'
import json, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for v in ("off", "on"):
    for r in range(1, rounds + 1):
        with open(f"{d}/{v}-{r}.json") as f:
            for row in json.load(f)["results"]:
                e = rows.setdefault(row["bytes"], {"off": {"lat": [], "bw": []}, "on": {"lat": [], "bw": []}})
                if "latency" in row:
                    e[v]["lat"].append(row["latency"]["p50_us"])
                if "bandwidth" in row:
                    e[v]["bw"].append(row["bandwidth"]["gbps"])
print(f"{'size':>10} | {'p50 off us':>10} {'p50 on us':>10} {'on/off':>7} | {'GB/s off':>9} {'GB/s on':>9} {'on/off':>7}")
for size in sorted(rows):
    e = rows[size]
    lo, ln = statistics.median(e["off"]["lat"]), statistics.median(e["on"]["lat"])
    bo, bn = statistics.median(e["off"]["bw"]), statistics.median(e["on"]["bw"])
    print(f"{size:>10} | {lo:>10.1f} {ln:>10.1f} {ln / lo:>7.3f} | {bo:>9.4f} {bn:>9.4f} {bn / bo:>7.3f}")
PY
