#!/usr/bin/env bash
# The main job: two sidecars as two nodes on loopback (the two-node example config with a
# fresh key file from `tensorlane keygen`) and two workers. Each worker exposes a receive
# buffer, writes its shard of random data into the other's, waits for the notification,
# verifies the contents and prints sizes, times and GB/s; then, while both workers are still
# connected, `tensorlane status` shows node-a's clients, regions, peer and counters. Cleans up
# every process and file it made, also on Ctrl-C or failure.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/demo.sh [--no-install] [--no-build] [--build-dir DIR] [--dry-run] [--bytes N]
                       [--iterations N]

Runs two sidecars (node-a and node-b, on loopback) and a worker on each; the workers exchange
and verify tensors, then `tensorlane status` shows node-a while they are connected.
  --no-install     do not run scripts/install-deps.sh (which installs missing Debian packages)
  --no-build       use the binaries already built in the build directory
  --build-dir DIR  the build directory (default build/release, the release preset's)
  --dry-run        show what would be installed and run; change nothing
  --bytes N        shard size per worker: bytes, a multiple of 8, or with KiB, MiB or GiB
                   (default 64MiB); the two workers' buffers take 6 x N of memory
  --iterations N   exchanges per worker, 1-1000000 (default 5)
USAGE
}

# Problems with the arguments are found here, before anything is installed, built or started.
bad_usage() {
    echo "demo: $*" >&2
    echo "demo: scripts/demo.sh --help lists the options" >&2
    exit 2
}

# "64MiB" -> 67108864; nothing printed (and status 1) for anything but digits with an optional
# binary suffix. Lengths are checked first, so bash arithmetic cannot overflow.
parse_bytes() {
    local text=$1 digits unit scale
    [[ $text =~ ^([0-9]{1,13})(KiB|MiB|GiB|K|M|G)?$ ]] || return 1
    digits=$((10#${BASH_REMATCH[1]}))
    unit=${BASH_REMATCH[2]}
    case "$unit" in
        "") scale=1 ;;
        K|KiB) scale=1024 ;;
        M|MiB) scale=$((1024 * 1024)) ;;
        G|GiB) scale=$((1024 * 1024 * 1024)) ;;
    esac
    echo $((digits * scale))
}

install=1
build_them=1
build=build/release
dry_run=0
bytes_arg=64MiB
iterations=5
while [ $# -gt 0 ]; do
    case "$1" in
        --no-install) install=0 ;;
        --no-build) build_them=0 ;;
        --dry-run) dry_run=1 ;;
        --bytes|--iterations|--build-dir)
            [ $# -ge 2 ] || bad_usage "$1 needs a value"
            case "$1" in
                --bytes) bytes_arg=$2 ;;
                --iterations) iterations=$2 ;;
                --build-dir) build=$(realpath -m -- "$2") ;;
            esac
            shift ;;
        --bytes=*) bytes_arg=${1#--bytes=} ;;
        --iterations=*) iterations=${1#--iterations=} ;;
        -h|--help) usage; exit 0 ;;
        *) bad_usage "unknown argument '$1'" ;;
    esac
    shift
done

bytes=$(parse_bytes "$bytes_arg") || bytes=
if [ -z "$bytes" ] || [ "$bytes" -lt 8 ] || [ $((bytes % 8)) -ne 0 ] ||
    [ "$bytes" -gt $((1 << 40)) ]; then
    bad_usage "--bytes '$bytes_arg': expected a number of bytes, a multiple of 8 from 8 to 1 TiB" \
        "(e.g. 67108864 or 64MiB)"
fi
if ! [[ $iterations =~ ^[0-9]{1,7}$ ]] || [ "$((10#$iterations))" -lt 1 ] ||
    [ "$((10#$iterations))" -gt 1000000 ]; then
    bad_usage "--iterations '$iterations': expected a whole number from 1 to 1000000"
fi
iterations=$((10#$iterations))

# Each worker allocates its receive buffer (2 shards) and its send buffer (1 shard) from the
# sidecar, which backs them with memory up front: 6 shards must fit, or a worker fails half-way.
mem_kib=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo 2>/dev/null) || mem_kib=
if [[ $mem_kib =~ ^[0-9]+$ ]] && [ $((6 * bytes)) -gt $((mem_kib * 1024)) ]; then
    mem_free=$((mem_kib * 1024))
    bad_usage "--bytes $bytes_arg needs $((6 * bytes >> 20)) MiB of memory for the workers'" \
        "buffers, $((mem_free >> 20)) MiB are available"
fi

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

if [ "$dry_run" -eq 1 ]; then
    scripts/install-deps.sh --dry-run
    echo "demo: would build tensorlane-sidecar, tensorlane and tensorlane-example-exchange in $build,"
    echo "demo: start node-a and node-b from config/examples/two-node{,-b}.toml on loopback ports"
    echo "demo: and exchange $bytes bytes per worker $iterations times; nothing was changed"
    exit 0
fi

if [ "$install" -eq 1 ]; then
    echo "== dependencies (scripts/install-deps.sh installs missing Debian packages with apt-get)"
    scripts/install-deps.sh
fi

# The build prints a line per file; keep it in a log shown only on failure.
if [ "$build_them" -eq 1 ]; then
    echo "== building tensorlane-sidecar, tensorlane and the example worker (release preset;" \
        "a few minutes the first time)"
    mkdir -p "$build"
    build_log=$build/demo-build.log
    # The release preset configures build/release; another directory is configured already.
    configure=(true)
    [ "$build" != build/release ] || configure=(cmake --preset release)
    if ! { "${configure[@]}" &&
        cmake --build "$build" --target tensorlane-sidecar tensorlane tensorlane-example-exchange \
            -j "$(nproc)"; } >"$build_log" 2>&1; then
        tail -n 30 "$build_log" >&2
        echo "demo: the build failed; the whole log is $build_log" >&2
        exit 1
    fi
fi
sidecar_bin=$build/sidecar/tensorlane-sidecar
cli_bin=$build/sidecar/tensorlane
example=$build/shim/tensorlane-example-exchange
for exe in "$sidecar_bin" "$cli_bin" "$example"; do
    [ -x "$exe" ] || { echo "demo: $exe is not built (leave out --no-build)" >&2; exit 1; }
done

work=$(mktemp -d /tmp/tensorlane-demo.XXXXXX)
pids=()
cleanup() {
    local rc=$?
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    if [ "$rc" -eq 130 ]; then
        echo "demo: interrupted; stopped its processes and removed $work" >&2
    elif [ "$rc" -ne 0 ] && [ -d "$work" ]; then
        echo "demo failed (exit $rc); the sidecars' last log lines:" >&2
        tail -n 20 "$work"/sidecar-*.log >&2 || true
    fi
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A fresh peer key for both nodes: the documented way (tensorlane-key-v1, mode 0600).
"$cli_bin" keygen "$work/peer.key" >/dev/null

# The example configs, pointed at this run's key, sockets and free ports.
port_a=$((20000 + RANDOM % 20000))
port_b=$((port_a + 1))
for node in a b; do
    src=config/examples/two-node.toml
    [ "$node" = b ] && src=config/examples/two-node-b.toml
    sed -e "s|/tmp/tensorlane-demo/peer.key|$work/peer.key|" \
        -e "s|/tmp/tensorlane-node-\\([ab]\\).sock|$work/node-\\1.sock|" \
        -e "s|127.0.0.1:18515|127.0.0.1:$port_a|" \
        -e "s|127.0.0.1:18516|127.0.0.1:$port_b|" \
        "$src" >"$work/node-$node.toml"
done

# What the two files say, in words (from --check-config --json, which also validates them).
echo "== configuration"
for node in a b; do
    if ! "$sidecar_bin" --check-config "$work/node-$node.toml" --json >"$work/node-$node.json" \
        2>"$work/check-$node.log"; then
        cat "$work/check-$node.log" >&2
        exit 1
    fi
done
python3 - "$work/node-a.json" "$work/node-b.json" "$work/peer.key" <<'PY'
import json, sys
nodes = [json.load(open(p)) for p in sys.argv[1:3]]
for n in nodes:
    peers = ", ".join(f"{p['name']} at {p['address']}" for p in n["peers"])
    d = n["derived"]
    print(f"{n['node']['name']}: listens for peers on {n['node']['listen']}; its workers connect to "
          f"{n['node']['socket']}")
    print(f"        peer {peers} over {d['transport']} ({d['transport_reason']})")
f, d = nodes[0]["fabric"], nodes[0]["derived"]
print(f"both:   traffic class {d['traffic_class']} (DSCP {f['dscp']} << 2 | ECN "
      f"{2 if f['ecn'] else 0}; marks RoCE packets, unused over tcp), "
      f"{nodes[0]['tcp']['connections_per_peer']} data connections per peer")
print(f"        peer key {sys.argv[3]} (tensorlane-key-v1, mode 0600, from `tensorlane keygen`)")
print("        every setting: tensorlane-sidecar --check-config config/examples/two-node.toml")
PY

echo "== starting two sidecars"
for node in a b; do
    "$sidecar_bin" --config "$work/node-$node.toml" 2>"$work/sidecar-$node.log" &
    pids+=($!)
done
for i in 0 1; do
    node=$([ "$i" -eq 0 ] && echo a || echo b)
    for _ in $(seq 200); do
        [ -S "$work/node-$node.sock" ] && break
        kill -0 "${pids[$i]}" 2>/dev/null || break
        sleep 0.05
    done
    [ -S "$work/node-$node.sock" ] || { echo "demo: sidecar node-$node did not start" >&2; exit 1; }
done

echo "== two workers exchange $bytes bytes each, $iterations times"
declare -A worker_pid
for node in a b; do
    me=$node peer=b seed=1 peer_seed=2
    [ "$node" = b ] && peer=a seed=2 peer_seed=1
    "$example" --socket "$work/node-$me.sock" --peer "node-$peer" --bytes "$bytes" \
        --iterations "$iterations" --seed "$seed" --peer-seed "$peer_seed" \
        --hold "$work/hold-$me" &
    worker_pid[$node]=$!
    pids+=($!)
done

# Each worker creates its hold file when it is done and stays connected until it is removed.
while ! { [ -e "$work/hold-a" ] && [ -e "$work/hold-b" ]; }; do
    for node in a b; do
        if [ ! -e "$work/hold-$node" ] && ! kill -0 "${worker_pid[$node]}" 2>/dev/null; then
            rc=0
            wait "${worker_pid[$node]}" || rc=$?
            echo "demo: the worker on node-$node stopped before it was done (exit $rc)" >&2
            exit 1
        fi
    done
    sleep 0.05
done

echo "== node-a while both workers are connected: tensorlane status --socket $work/node-a.sock"
"$cli_bin" status --socket "$work/node-a.sock"

rm -f "$work/hold-a" "$work/hold-b"
for node in a b; do
    rc=0
    wait "${worker_pid[$node]}" || rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "demo: the worker on node-$node failed (exit $rc)" >&2
        exit 1
    fi
done
echo "demo: ok: $iterations exchanges of $bytes bytes each way, verified; stopping and cleaning up"
