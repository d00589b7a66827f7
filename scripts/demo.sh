#!/usr/bin/env bash
# The main job: two sidecars as two nodes on loopback (the two-node example config with a
# fresh key file) and two workers. Each worker exposes a receive buffer, writes its shard of
# random data into the other's, waits for the notification, verifies the contents and prints
# sizes, times and GB/s. Cleans up every process and file it made, also on Ctrl-C or failure.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/demo.sh [--no-install] [--bytes N] [--iterations N]

  --no-install     do not run scripts/install-deps.sh
  --bytes N        shard size per worker in bytes (default 67108864)
  --iterations N   exchanges per worker (default 5)
USAGE
}

install=1
bytes=$((64 << 20))
iterations=5
while [ $# -gt 0 ]; do
    case "$1" in
        --no-install) install=0 ;;
        --bytes) bytes=$2; shift ;;
        --iterations) iterations=$2; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
    shift
done

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
if [ "$install" -eq 1 ]; then
    scripts/install-deps.sh
fi

build=build/release
cmake --preset release >/dev/null
cmake --build "$build" --target tensorlane-sidecar tensorlane tensorlane-example-exchange \
    -j "$(nproc)"

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
    if [ "$rc" -ne 0 ] && [ -d "$work" ]; then
        echo "demo failed (exit $rc); sidecar logs:" >&2
        tail -n 20 "$work"/*.log >&2 || true
    fi
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A fresh pre-shared key, readable by its owner only.
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/peer.key")

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

echo "== configuration (node-a)"
"$build/sidecar/tensorlane-sidecar" --check-config "$work/node-a.toml" | grep -E \
    'name|traffic_class|transport|listen|socket' | head -n 8

echo "== starting two sidecars"
for node in a b; do
    "$build/sidecar/tensorlane-sidecar" --config "$work/node-$node.toml" \
        2>"$work/sidecar-$node.log" &
    pids+=($!)
done
for node in a b; do
    for _ in $(seq 100); do
        [ -S "$work/node-$node.sock" ] && break
        sleep 0.05
    done
    [ -S "$work/node-$node.sock" ] || { echo "sidecar $node did not start" >&2; exit 1; }
done

echo "== two workers exchange ${bytes} bytes each, ${iterations} times"
example="$build/shim/tensorlane-example-exchange"
"$example" --socket "$work/node-a.sock" --peer node-b --bytes "$bytes" \
    --iterations "$iterations" --seed 1 --peer-seed 2 &
worker_a=$!
pids+=("$worker_a")
"$example" --socket "$work/node-b.sock" --peer node-a --bytes "$bytes" \
    --iterations "$iterations" --seed 2 --peer-seed 1 &
worker_b=$!
pids+=("$worker_b")
wait "$worker_a"
wait "$worker_b"

echo "== sidecar status (node-a)"
"$build/sidecar/tensorlane" status --socket "$work/node-a.sock"
echo "demo: ok"
