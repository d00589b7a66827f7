#!/usr/bin/env bash
# Tests of scripts/hw-check.sh against the simulated HCA: two "hosts" on this one (node-a on
# sim0 as the server, node-b on sim1 as the client, each its own TOML and sidecar), the
# production binaries with the library swapped by LD_LIBRARY_PATH. The dry runs check every
# command names the device, GID index and traffic class the TOML resolves to; the real run
# checks that both sides finish every step and the client prints the ratios.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: tests/scripts/hw_check_test.sh --build-dir DIR --simhca DIR

  --build-dir DIR   the build tree (sidecar/tensorlane, sidecar/tensorlane-sidecar,
                    tests/simhca/test/simhca_conformance)
  --simhca DIR      the directory of the simulated HCA's libibverbs.so.1
Ends with "N passed, M failed"; exits 1 when any case failed.
USAGE
}

build="" simdir=""
while [ "$#" -gt 0 ]; do
    case "$1" in
        --build-dir) build=$2; shift 2 ;;
        --simhca) simdir=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
if [ ! -x "$build/sidecar/tensorlane" ] || [ ! -e "$simdir/libibverbs.so.1" ]; then
    usage >&2
    exit 2
fi

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
script="$repo/scripts/hw-check.sh"
work=$(mktemp -d)
server_pid=""
cleanup() {
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
passed=0
failed=0

ok() {
    echo "ok: $1"
    passed=$((passed + 1))
}
fail() {
    echo "FAILED: $1"
    [ -z "${2:-}" ] || sed 's/^/    /' "$2"
    failed=$((failed + 1))
}

# The two simulated devices on addresses of our own, and a TOML per node.
net="127.$((1 + ($$ >> 8) % 250)).$(($$ % 250))"
bash "$repo/tests/simhca/tools/mksysfs.sh" "$work/sys" --dev sim0 --netdev hwc0 --ip "$net.2" --mtu 4200 >/dev/null
bash "$repo/tests/simhca/tools/mksysfs.sh" "$work/sys" --dev sim1 --netdev hwc1 --ip "$net.3" --mtu 4200 >/dev/null
# A third device with its IPv4 RoCE v2 GID at index 5, for a TOML that names the index.
bash "$repo/tests/simhca/tools/mksysfs.sh" "$work/sys" --dev sim2 --netdev hwc2 --ip "$net.4" \
    --gid-index 5 >/dev/null
export TENSORLANE_SYSFS_ROOT="$work/sys"
export LD_LIBRARY_PATH="$simdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
"$build/sidecar/tensorlane" keygen "$work/peer.key" >/dev/null
port_of() {  # a free TCP port on 127.0.0.1
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
pa=$(port_of)
pb=$(port_of)
# toml NAME DEVICE LISTEN PEER PEER_PORT [FABRIC_LINES]
toml() {
    cat <<EOF
[node]
name = "$1"
listen = "127.0.0.1:$3"
socket = "$work/$1.sock"
[fabric]
transport = "verbs"
device = "$2"
${6:-}
[ipc]
poll_mode = "event"
[security]
peer_key_file = "$work/peer.key"
[[peers]]
name = "$4"
address = "127.0.0.1:$5"
EOF
}
toml node-a sim0 "$pa" node-b "$pb" >"$work/a.toml"
toml node-b sim1 "$pb" node-a "$pa" >"$work/b.toml"

# ---- usage and config errors ------------------------------------------------------------------
rc=0
"$script" --build-dir "$build" --config "$work/b.toml" >"$work/out" 2>&1 || rc=$?
if [ "$rc" -eq 2 ] && grep -q -- "--server, or --peer HOST" "$work/out"; then
    ok "no role: exit 2 with the reason"
else
    fail "no role (exit $rc)" "$work/out"
fi
rc=0
"$script" --build-dir "$build" --config "$work/b.toml" --server --peer 127.0.0.1 >"$work/out" 2>&1 || rc=$?
if [ "$rc" -eq 2 ] && grep -q "exclude each other" "$work/out"; then
    ok "--server with --peer: exit 2"
else
    fail "--server with --peer (exit $rc)" "$work/out"
fi
sed 's/transport = "verbs"/transport = "tcp"/' "$work/b.toml" >"$work/tcp.toml"
rc=0
"$script" --build-dir "$build" --config "$work/tcp.toml" --peer 127.0.0.1 --dry-run >"$work/out" 2>&1 || rc=$?
if [ "$rc" -eq 2 ] && grep -q "resolves to transport tcp, not verbs" "$work/out"; then
    ok "a TOML on tcp is refused (exit 2)"
else
    fail "a TOML on tcp (exit $rc)" "$work/out"
fi

# ---- dry runs -------------------------------------------------------------------------------
rc=0
"$script" --build-dir "$build" --config "$work/b.toml" --peer 127.0.0.1 --dry-run \
    --sizes "65536 1048576" >"$work/dry" 2>&1 || rc=$?
expect=(
    "tensorlane diag --config $work/b.toml --no-probe"
    "(no peer probe: no sidecar runs yet; step 3's bench writes to the peer)"
    "ib_write_lat -F -d sim1 -i 1 -x 3 --tclass 106 -p 18600 -s 64 -n 10000 127.0.0.1"
    "ib_write_bw -F -d sim1 -i 1 -x 3 --tclass 106 -p 18601 -s 65536 -n 5000 -q 2 -t 128 127.0.0.1"
    "ib_write_bw -F -d sim1 -i 1 -x 3 --tclass 106 -p 18602 -s 1048576 -n 5000 -q 2 -t 128 127.0.0.1"
    "tensorlane-sidecar --config $work/b.toml &"
    "tensorlane bench --socket $work/node-b.sock --peer node-a --tag hwcheck-lat --no-baseline"
    "--test bw --sizes 65536,1048576 --window 128 --duration 2"
    "SIMHCA_CONFORMANCE_DEVICE=sim1 SIMHCA_CONFORMANCE_GID_INDEX=3"
)
missing=""
for e in "${expect[@]}"; do
    grep -qF -- "$e" "$work/dry" || missing+=" [$e]"
done
if [ "$rc" -eq 0 ] && [ -z "$missing" ] && [ ! -e "$work/node-b.sock" ]; then
    ok "dry run, client: every step's command, with sim1, GID 3, traffic class 106; nothing ran"
else
    fail "dry run, client (exit $rc), missing:$missing" "$work/dry"
fi
toml node-b sim2 "$pb" node-a "$pa" $'dscp = 10\necn = false\ngid_index = 5' >"$work/b2.toml"
rc=0
"$script" --build-dir "$build" --config "$work/b2.toml" --server --peer-node node-a --dry-run \
    --skip-diag --skip-conformance >"$work/dry2" 2>&1 || rc=$?
if [ "$rc" -eq 0 ] && grep -qF -- "ib_write_lat -F -d sim2 -i 1 -x 5 --tclass 40 -p 18600 -s 64" "$work/dry2" &&
    ! grep -q "127.0.0.1$" "$work/dry2" &&
    grep -qF -- "tensorlane bench --respond --socket $work/node-b.sock --peer node-a" "$work/dry2" &&
    ! grep -q "diag\|CONFORMANCE" "$work/dry2"; then
    ok "dry run, server: the TOML's device, GID index 5, DSCP 10 without ECN (traffic class 40)"
else
    fail "dry run, server (exit $rc)" "$work/dry2"
fi

# ---- a real run on the simulated pair ------------------------------------------------------------
if ! command -v ib_write_lat >/dev/null || ! command -v ib_write_bw >/dev/null; then
    echo "skip: the real run needs perftest (ib_write_lat, ib_write_bw)"
else
    common=(--build-dir "$build" --iters 300 --sizes "65536 262144" --bw-iters 200 --window 16
        --duration 0.3 --port "$((20000 + $$ % 20000))"
        --conformance-filter 'Device.*:Rc.WriteWithImmediatePlacesDataAndConsumesARecv')
    "$script" --config "$work/a.toml" --server "${common[@]}" --out "$work/server" \
        >"$work/server.txt" 2>&1 &
    server_pid=$!
    rc=0
    timeout 150 "$script" --config "$work/b.toml" --peer 127.0.0.1 "${common[@]}" \
        --out "$work/client" >"$work/client.txt" 2>&1 || rc=$?
    src=0
    wait "$server_pid" || src=$?
    server_pid=""
    if [ "$rc" -eq 0 ] && [ "$src" -eq 0 ] &&
        grep -q "64 B one-way (RTT/2), median: ib_write_lat .* us, tensorlane .* us" "$work/client.txt" &&
        grep -qE "^ +262144 +[0-9.]+ +[0-9.]+ +[0-9]+%$" "$work/client.txt" &&
        grep -q "bandwidth goal (at least 95% of ib_write_bw from 64 KiB up): " "$work/client.txt" &&
        grep -q "^\[  PASSED  \] 2 tests" "$work/client.txt" &&
        grep -q "^\[  PASSED  \] 2 tests" "$work/server.txt" &&
        grep -q "the bench on node-b is done" "$work/server/bench.bw.txt" &&
        ! grep -q "^\[warn\] peer" "$work/client/diag.txt" "$work/server/diag.txt" &&
        [ ! -e "$work/node-a.sock" ] && [ ! -e "$work/node-b.sock" ]; then
        ok "real run: both sides finish diag, perftest, bench and conformance; the client prints the ratios; the sidecars stopped"
        sed -n '/== tensorlane vs perftest/,$p' "$work/client.txt" | sed 's/^/    /'
    else
        echo "client exit $rc, server exit $src" >>"$work/client.txt"
        cat "$work/server.txt" >>"$work/client.txt"
        fail "real run" "$work/client.txt"
    fi
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
