#!/usr/bin/env bash
# Tests of scripts/roce-setup.sh and scripts/roce-diag.sh against a fixture sysfs tree, with fake
# mlnx_qos/dcb/sysctl/ip/ethtool on PATH that log their arguments and print read-back from a
# state directory (so idempotency is tested: a second run changes nothing).
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: tests/scripts/roce_scripts_test.sh --sidecar BIN --cli BIN --fixture BIN

  --sidecar BIN   tensorlane-sidecar (its --check-config --json feeds roce-setup)
  --cli BIN       tensorlane (roce-diag delegates to `tensorlane diag`)
  --fixture BIN   make_sysfs_fixture (writes the standard fixture tree)
Ends with "N passed, M failed"; exits 1 when any case failed.
USAGE
}

sidecar="" cli="" fixture=""
while [ "$#" -gt 0 ]; do
    case "$1" in
        --sidecar) sidecar=$2; shift 2 ;;
        --cli) cli=$2; shift 2 ;;
        --fixture) fixture=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
if [ ! -x "$sidecar" ] || [ ! -x "$cli" ] || [ ! -x "$fixture" ]; then
    usage >&2
    exit 2
fi

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0
failed=0

# A fresh case: fixture tree, state, config, and a PATH with only the named fakes (and /usr/bin,
# which holds no dcb/sysctl/mlnx_qos/ethtool; ip is always faked so nothing real is touched).
new_case() {
    case_dir=$(mktemp -d "$work/case.XXXX")
    sys="$case_dir/sys"
    export FAKE_STATE="$case_dir/state"
    mkdir -p "$FAKE_STATE" "$case_dir/bin"
    : >"$FAKE_STATE/calls.log"
    "$fixture" "$sys"
    for tool in ip "$@"; do
        ln -s "$here/fakebin/$tool" "$case_dir/bin/$tool"
    done
    printf '[node]\nname = "node-a"\n\n[fabric]\ndscp = 26\npfc_priority = 3\n' >"$case_dir/node.toml"
    out="$case_dir/out"
}

setup() {
    set +e
    PATH="$case_dir/bin:/usr/bin" TENSORLANE_SYSFS_ROOT="$sys" \
        "$repo/scripts/roce-setup.sh" --config "$case_dir/node.toml" --sidecar "$sidecar" "$@" \
        >"$out" 2>&1
    rc=$?
    set -e
}

check() {  # check NAME CONDITION...
    local name=$1
    shift
    if "$@"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "FAIL: $name"
        echo "--- output:"
        cat "$out"
        echo "--- calls:"
        cat "$FAKE_STATE/calls.log"
    fi
}
has() { grep -qF -- "$1" "$out"; }
lacks() { ! grep -qF -- "$1" "$out"; }
logged() { grep -qF -- "$1" "$FAKE_STATE/calls.log"; }
not_logged() { ! grep -qF -- "$1" "$FAKE_STATE/calls.log"; }

# --- mlnx_qos: a misconfigured NIC, dry run ---------------------------------------------------
new_case mlnx_qos sysctl
echo 0 >"$FAKE_STATE/map_26"             # DSCP 26 on priority 0
echo 1500 >"$sys/class/net/eth0/mtu"
echo 0 >"$sys/class/net/eth0/ecn/roce_np/enable/3"
setup --dry-run
check "dry run exits 0" test "$rc" -eq 0
check "dry run: trust" has "would run: mlnx_qos -i eth0 --trust dscp"
check "dry run: dscp map" has "would run: mlnx_qos -i eth0 --dscp2prio set,26,3"
check "dry run: pfc on 3 alone" has "would run: mlnx_qos -i eth0 --pfc 0,0,0,1,0,0,0,0"
check "dry run: ecn np" has "would run: echo 1 > $sys/class/net/eth0/ecn/roce_np/enable/3"
check "dry run: ecn rp already on" has "already:  ECN roce_rp on priority 3"
check "dry run: mtu" has "would run: ip link set dev eth0 mtu 4200"
check "dry run: sysctl" has "would run: sysctl -q -w net.core.rmem_max=268435456"
check "dry run: summary" has "(dry run: nothing was changed)"
check "dry run changes nothing: no set calls" not_logged "--trust"
check "dry run changes nothing: no sysctl -w" not_logged "sysctl -q -w"
check "dry run changes nothing: no ip" not_logged "ip link"
check "dry run changes nothing: ecn file" test "$(cat "$sys/class/net/eth0/ecn/roce_np/enable/3")" = 0

# --- the same for real, then again: idempotent ------------------------------------------------
setup
check "real run exits 0" test "$rc" -eq 0
check "real run: trust set" logged "mlnx_qos -i eth0 --trust dscp"
check "real run: mtu set" test "$(cat "$sys/class/net/eth0/mtu")" = 4200
check "real run: ecn set" test "$(cat "$sys/class/net/eth0/ecn/roce_np/enable/3")" = 1
: >"$FAKE_STATE/calls.log"
setup
check "second run exits 0" test "$rc" -eq 0
check "second run sets nothing" has "0 set, 14 already right, 0 not set"
check "second run: no mlnx_qos set call" not_logged "--"
check "second run: no sysctl -w" not_logged "sysctl -q -w"

# --- dcb (iproute2 6.1, no apptrust) when mlnx_qos is missing ----------------------------------
new_case dcb sysctl
setup --dry-run --no-sysctl
check "dcb: pfc" has "would run: dcb pfc set dev eth0 prio-pfc all:off 3:on"
check "dcb: dscp map" has "would run: dcb app replace dev eth0 dscp-prio 26:3"
check "dcb: trust cannot be set, says why" has "NOT SET:  trust dscp: this iproute2's dcb has no apptrust"
check "dcb: exit 1 when something is not set" test "$rc" -eq 1
check "dcb: no sysctl with --no-sysctl" not_logged "sysctl"
setup --no-sysctl
check "dcb: real run wrote the pfc state" grep -q "3:on" "$FAKE_STATE/dcb_pfc"
setup --dry-run --no-sysctl
check "dcb: second run sets no pfc" lacks "would run: dcb pfc"
check "dcb: second run sets no app" lacks "would run: dcb app"

# --- no QoS tool at all: said, not hidden -----------------------------------------------------
new_case sysctl
setup --dry-run
check "no tools: said" has "NOT SET:  trust/DSCP map/PFC: neither mlnx_qos nor dcb is installed"
check "no tools: exit 1" test "$rc" -eq 1

# --- the host-wide traffic class --------------------------------------------------------------
new_case mlnx_qos sysctl
printf 'Global tclass=96\n' >"$sys/class/infiniband/mlx5_0/tc/1/traffic_class" 2>/dev/null ||
    { mkdir -p "$sys/class/infiniband/mlx5_0/tc/1"; printf 'Global tclass=96\n' >"$sys/class/infiniband/mlx5_0/tc/1/traffic_class"; }
setup --dry-run --netdev eth0 --device mlx5_0
check "tclass: reported, not written, without --set-tclass" has "host traffic class is 96, the file's is 106: the sidecar will refuse to start"
check "tclass: not written" lacks "would run: echo 106"
setup --dry-run --set-tclass --netdev eth0 --device mlx5_0
check "tclass: --set-tclass writes it" has "would run: echo 106 > $sys/class/infiniband/mlx5_0/tc/1/traffic_class"

# --- no RDMA device and netdev auto: the reason, not "()" (issue 24) ---------------------------
new_case mlnx_qos sysctl
rm -rf "$sys/class/infiniband"
setup --dry-run
check "no device: exit 2" test "$rc" -eq 2
check "no device: the reason is given" has "the transport resolves to tcp: no RDMA device under"
check "no device: never an empty reason" lacks "()"
check "no device: what to do" has "pass --netdev IFACE or set [fabric] netdev"

# --- usage ------------------------------------------------------------------------------------
new_case
set +e
"$repo/scripts/roce-setup.sh" >"$out" 2>&1
rc=$?
set -e
check "setup without --config: exit 2" test "$rc" -eq 2
check "setup without --config: says so" has "--config FILE is required"

# --- roce-diag.sh -----------------------------------------------------------------------------
new_case mlnx_qos ethtool
set +e
PATH="$case_dir/bin:/usr/bin" "$repo/scripts/roce-diag.sh" --sysfs-root "$sys" --no-delegate >"$out" 2>&1
rc=$?
set -e
check "diag: exit 0" test "$rc" -eq 0
check "diag: device" has "mlx5_0: MT4125, fw 22.39.1002"
check "diag: port state" has "port 1: 4: ACTIVE, 5: LinkUp, Ethernet"
check "diag: GID table v2 IPv4" has "0000:0000:0000:0000:0000:ffff:0a00:0002 10.0.0.2        v2   eth0"
check "diag: empty GIDs left out" lacks "0000:0000:0000:0000:0000:0000:0000:0000"
check "diag: PFC read back" has "enabled     0   0   0   0   0   0   0   0"
check "diag: pause counters" has "rx_prio3_pause: 5"
check "diag: CNP counters" has "np_cnp_sent=0"
check "diag: PCIe path" has "NIC mlx5_0: devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:03:00.0"
set +e
PATH="$case_dir/bin:/usr/bin" "$repo/scripts/roce-diag.sh" --sysfs-root "$sys" \
    --config "$case_dir/node.toml" --tensorlane "$cli" --json >"$out" 2>/dev/null
rc=$?
set -e
check "diag delegates to tensorlane diag" grep -q '"gid_index": 3' "$out"
# The fake NIC trusts pcp while the file says dscp: a failing finding, exit status 1.
check "diag delegation: trust mismatch fails" grep -q '"detail": "eth0 trusts pcp' "$out"
check "diag delegation keeps diag's exit status" test "$rc" -eq 1

echo
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
