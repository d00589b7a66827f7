#!/usr/bin/env bash
# RoCE diagnostics for hosts that have only the scripts: RDMA devices and ports, the GID table,
# PFC and the congestion/pause counters, the host-wide traffic class, ECN knobs and the PCIe
# placement of NICs and GPUs. Where `tensorlane` is installed and a config is given, it hands
# over to `tensorlane diag`, which checks the same against the TOML. Reads only.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/roce-diag.sh [--config FILE] [--sysfs-root DIR] [--json] [--no-delegate]

  --config FILE      the node's TOML; with `tensorlane` installed, runs `tensorlane diag`
  --sysfs-root DIR   read sysfs there (default: $TENSORLANE_SYSFS_ROOT or /sys)
  --json             with tensorlane diag: its JSON
  --no-delegate      print the plain diagnostics even where tensorlane is installed
  --tensorlane BIN   the tensorlane binary (default: on PATH, else build/release)
  -h, --help         this text
Changes nothing. Exit status: tensorlane diag's when delegating (0 ok/warn, 1 a failing
finding), else 0, or 2 on a usage error.
USAGE
}

config=""
json=0
delegate=1
cli=""
sysfs="${TENSORLANE_SYSFS_ROOT:-/sys}"
while [ "$#" -gt 0 ]; do
    case "$1" in
        --config) config=${2:?--config needs a FILE}; shift 2 ;;
        --sysfs-root) sysfs=${2:?--sysfs-root needs a DIR}; shift 2 ;;
        --json) json=1; shift ;;
        --no-delegate) delegate=0; shift ;;
        --tensorlane) cli=${2:?--tensorlane needs a BIN}; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
[ -d "$sysfs" ] || { echo "roce-diag: no sysfs at $sysfs" >&2; exit 2; }

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -z "$cli" ]; then
    if command -v tensorlane >/dev/null 2>&1; then
        cli=$(command -v tensorlane)
    elif [ -x "$root/build/release/sidecar/tensorlane" ]; then
        cli="$root/build/release/sidecar/tensorlane"
    fi
fi
if [ "$delegate" -eq 1 ] && [ -n "$config" ] && [ -n "$cli" ]; then
    args=(diag --config "$config" --sysfs-root "$sysfs")
    [ "$json" -eq 0 ] || args+=(--json)
    echo "roce-diag: delegating to $cli ${args[*]}" >&2
    exec "$cli" "${args[@]}"
fi
if [ "$delegate" -eq 1 ] && [ -n "$config" ]; then
    echo "roce-diag: tensorlane is not installed: plain diagnostics, not checked against $config" >&2
fi

section() { printf '\n== %s\n' "$*"; }
val() { cat "$1" 2>/dev/null || echo "(unreadable)"; }
have() { command -v "$1" >/dev/null 2>&1; }

ib="$sysfs/class/infiniband"
netdevs=()

section "RDMA devices and ports"
if ! compgen -G "$ib/*" >/dev/null; then
    echo "no RDMA device under $ib (driver not loaded? \`modprobe mlx5_ib\`, \`rdma link show\`)"
fi
for d in "$ib"/*; do
    [ -e "$d" ] || continue
    dev=$(basename "$d")
    echo "$dev: $(val "$d/hca_type"), fw $(val "$d/fw_ver"), node GUID $(val "$d/node_guid")"
    for p in "$d"/ports/*; do
        [ -e "$p" ] || continue
        echo "  port $(basename "$p"): $(val "$p/state"), $(val "$p/phys_state"), $(val "$p/link_layer"), $(val "$p/rate")"
    done
done

section "GID table (non-empty entries; RoCE v2 IPv4-mapped is what tensorlane picks)"
printf '%-8s %-4s %-5s %-39s %-15s %-4s %s\n' DEV PORT INDEX GID IPv4 VER NETDEV
for g in "$ib"/*/ports/*/gids/*; do
    [ -e "$g" ] || continue
    gid=$(cat "$g" 2>/dev/null) || continue
    [ "$gid" != "0000:0000:0000:0000:0000:0000:0000:0000" ] || continue
    idx=$(basename "$g")
    portdir=$(dirname "$(dirname "$g")")
    port=$(basename "$portdir")
    dev=$(basename "$(dirname "$(dirname "$portdir")")")
    type=$(cat "$portdir/gid_attrs/types/$idx" 2>/dev/null || echo "?")
    nd=$(cat "$portdir/gid_attrs/ndevs/$idx" 2>/dev/null || echo "?")
    ver="?"
    case "$type" in "RoCE v2") ver=v2 ;; *v1) ver=v1 ;; esac
    v4=""
    case "$gid" in
        0000:0000:0000:0000:0000:ffff:*)
            h=${gid#0000:0000:0000:0000:0000:ffff:}
            h=${h//:/}
            v4="$((16#${h:0:2})).$((16#${h:2:2})).$((16#${h:4:2})).$((16#${h:6:2}))" ;;
    esac
    printf '%-8s %-4s %-5s %-39s %-15s %-4s %s\n' "$dev" "$port" "$idx" "$gid" "$v4" "$ver" "$nd"
    if [ "$nd" != "?" ] && [[ ! " ${netdevs[*]-} " =~ \ $nd\  ]]; then
        netdevs+=("$nd")
    fi
done

section "Host-wide traffic class (mlx5 tc/<port>/traffic_class)"
found_tc=0
for f in "$ib"/*/tc/*/traffic_class; do
    [ -e "$f" ] || continue
    found_tc=1
    content=$(cat "$f" 2>/dev/null || echo "(unreadable)")
    echo "${f#"$sysfs"/}: ${content:-(not set)}"
done
[ "$found_tc" -eq 1 ] || echo "no override file (the driver offers none, or none is set)"

for nd in ${netdevs[@]+"${netdevs[@]}"}; do
    section "$nd: MTU, QoS (trust, DSCP map, PFC), ECN"
    echo "MTU $(val "$sysfs/class/net/$nd/mtu"), $(val "$sysfs/class/net/$nd/operstate")"
    if have mlnx_qos; then
        mlnx_qos -i "$nd" 2>&1 | sed -n '/trust/p; /PFC configuration/,/enabled/p' ||
            echo "mlnx_qos -i $nd failed"
    elif have dcb; then
        dcb pfc show dev "$nd" prio-pfc 2>&1 || echo "dcb pfc show dev $nd failed"
        dcb -N app show dev "$nd" dscp-prio 2>&1 || echo "dcb app show dev $nd failed"
    else
        echo "trust/DSCP map/PFC: could not be read (neither mlnx_qos nor dcb is installed)"
    fi
    for point in np rp; do
        dir="$sysfs/class/net/$nd/ecn/roce_$point/enable"
        if [ -d "$dir" ]; then
            line=""
            for prio in "$dir"/*; do line+=" $(basename "$prio"):$(val "$prio")"; done
            echo "ECN roce_$point enable:$line"
        else
            echo "ECN roce_$point: no knobs under $dir"
        fi
    done
    if have ethtool; then
        stats=$(ethtool -S "$nd" 2>/dev/null | grep -i pause || true)
        echo "pause counters (ethtool -S):"
        echo "${stats:-  (none shown)}"
    else
        echo "pause counters: ethtool is not installed"
    fi
done

section "Congestion and error counters (hw_counters)"
for p in "$ib"/*/ports/*; do
    [ -d "$p/hw_counters" ] || continue
    line=""
    for c in np_cnp_sent np_ecn_marked_roce_packets rp_cnp_handled out_of_sequence \
             packet_seq_err local_ack_timeout_err; do
        [ -e "$p/hw_counters/$c" ] && line+=" $c=$(val "$p/hw_counters/$c")"
    done
    echo "$(basename "$(dirname "$(dirname "$p")")") port $(basename "$p"):${line:- (none readable)}"
done

section "PCIe placement (compare the paths: a shared switch is PIX/PXB in nvidia-smi topo -m)"
for d in "$ib"/*; do
    [ -e "$d/device" ] || continue
    echo "NIC $(basename "$d"): $(readlink -f "$d/device" | sed "s|^$sysfs/||")"
done
for dev in "$sysfs"/bus/pci/devices/*; do
    [ -e "$dev/vendor" ] || continue
    [ "$(cat "$dev/vendor" 2>/dev/null)" = "0x10de" ] || continue
    case "$(cat "$dev/class" 2>/dev/null)" in 0x0302*|0x0300*) ;; *) continue ;; esac
    echo "GPU $(basename "$dev"): $(readlink -f "$dev" | sed "s|^$sysfs/||") (NUMA $(val "$dev/numa_node"))"
done
if [ -d "$sysfs/module/nvidia_peermem" ]; then
    echo "nvidia-peermem: loaded"
else
    echo "nvidia-peermem: not loaded (dma-buf needs kernel >= 5.12 and rdma-core >= 34)"
fi
