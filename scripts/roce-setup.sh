#!/usr/bin/env bash
# Sets a RoCE NIC up for tensorlane from the node's TOML: trust mode, the DSCP->priority map,
# PFC on the RoCE priority alone, ECN/DCQCN on it, the netdev MTU, the socket-buffer sysctls,
# and (when asked) the host-wide traffic class. Values come from
# `tensorlane-sidecar --check-config FILE --json` (the file plus the fabric selection), so the
# NIC and the sidecar agree. Idempotent: each setting is read back and changed only when it
# differs. Uses mlnx_qos where present, else iproute2's dcb, else sysfs.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/roce-setup.sh --config FILE [options]

Sets the NIC of this node up for the TOML's [fabric] table (dscp, ecn, pfc_priority, trust, mtu).
  --config FILE      the node's TOML (required)
  --dry-run          print every command that would change the host, change nothing
  --netdev IFACE     the interface to set up (default: the fabric selection's, or [fabric] netdev)
  --device DEV       the RDMA device (default: the selection's, or [fabric] device)
  --netdev-mtu N     the interface MTU to set when the current one is too small for [fabric] mtu
                     (default: 4200 for mtu 4096, 2200 for 2048)
  --set-tclass       also write the host-wide traffic class (mlx5 tc/<port>/traffic_class) to
                     the file's DSCP<<2|ECN; by default it is only reported
  --no-sysctl        leave the socket-buffer sysctls alone
  --sidecar BIN      the tensorlane-sidecar binary (default: on PATH, else build/release)
  --sysfs-root DIR   read and write sysfs there (default: $TENSORLANE_SYSFS_ROOT or /sys)
  -h, --help         this text
Exit status: 0 when everything is set (or already was), 1 when something could not be set,
2 on a usage or config error.
USAGE
}

die() {
    echo "roce-setup: $*" >&2
    exit 2
}

config=""
dry_run=0
netdev=""
device=""
netdev_mtu=""
set_tclass=0
do_sysctl=1
sidecar=""
sysfs="${TENSORLANE_SYSFS_ROOT:-/sys}"
while [ "$#" -gt 0 ]; do
    case "$1" in
        --config) config=${2:?--config needs a FILE}; shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        --netdev) netdev=${2:?--netdev needs an IFACE}; shift 2 ;;
        --device) device=${2:?--device needs a DEV}; shift 2 ;;
        --netdev-mtu) netdev_mtu=${2:?--netdev-mtu needs a number}; shift 2 ;;
        --set-tclass) set_tclass=1; shift ;;
        --no-sysctl) do_sysctl=0; shift ;;
        --sidecar) sidecar=${2:?--sidecar needs a BIN}; shift 2 ;;
        --sysfs-root) sysfs=${2:?--sysfs-root needs a DIR}; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
[ -n "$config" ] || { usage >&2; die "--config FILE is required"; }
[ -r "$config" ] || die "cannot read $config"
[ -d "$sysfs" ] || die "no sysfs at $sysfs"

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -z "$sidecar" ]; then
    if command -v tensorlane-sidecar >/dev/null 2>&1; then
        sidecar=$(command -v tensorlane-sidecar)
    elif [ -x "$root/build/release/sidecar/tensorlane-sidecar" ]; then
        sidecar="$root/build/release/sidecar/tensorlane-sidecar"
    else
        die "tensorlane-sidecar not found (build it, put it on PATH, or pass --sidecar BIN)"
    fi
fi

# ---- what the file and the fabric selection say -------------------------------------------
set +e
json=$(TENSORLANE_SYSFS_ROOT="$sysfs" "$sidecar" --check-config "$config" --json 2>/dev/null)
check_rc=$?
set -e
[ -n "$json" ] || die "$sidecar --check-config $config printed nothing (exit $check_rc); run it to see why"
if [ "$check_rc" -ne 0 ]; then
    echo "roce-setup: note: --check-config reports errors the sidecar would refuse to start with;" \
         "the NIC is set up anyway (run: $sidecar --check-config $config)" >&2
fi

# json_get KEY.PATH: a value of the check-config JSON; empty for null or missing.
json_get() {
    if command -v python3 >/dev/null 2>&1; then
        python3 -c '
import json, sys
v = json.loads(sys.stdin.read())
for k in sys.argv[1].split("."):
    v = v.get(k) if isinstance(v, dict) else None
print("" if v is None else (str(v).lower() if isinstance(v, bool) else v))
' "$1" <<<"$json"
    elif command -v jq >/dev/null 2>&1; then
        jq -r ".$1 // empty" <<<"$json"
    else
        die "python3 or jq is needed to read the check-config JSON"
    fi
}

dscp=$(json_get fabric.dscp)
ecn=$(json_get fabric.ecn)
prio=$(json_get fabric.pfc_priority)
trust=$(json_get fabric.trust)
ib_mtu=$(json_get fabric.mtu)
tclass=$(json_get derived.traffic_class)
tclass_policy=$(json_get fabric.tclass_override)
port=$(json_get fabric_selection.port)
[ -n "$port" ] || port=$(json_get fabric.port)
[ -n "$netdev" ] || netdev=$(json_get fabric_selection.netdev)
if [ -z "$netdev" ]; then
    netdev=$(json_get fabric.netdev)
    [ "$netdev" != "auto" ] || netdev=""
fi
if [ -z "$netdev" ]; then
    # The selection runs only when the transport resolves to verbs; otherwise the reason is
    # why it did not (no RDMA device, transport = "tcp").
    why=$(json_get fabric_selection.error)
    if [ -z "$why" ]; then
        why="the transport resolves to $(json_get derived.transport): $(json_get derived.transport_reason)"
    fi
    die "cannot tell which interface to set up: no fabric selection ($why)," \
        "and [fabric] netdev is auto; pass --netdev IFACE or set [fabric] netdev"
fi
[ -n "$device" ] || device=$(json_get fabric_selection.device)
if [ -z "$device" ]; then
    device=$(json_get fabric.device)
    [ "$device" != "auto" ] || device=""
fi
if [ -z "$device" ] && [ -e "$sysfs/class/net/$netdev/device" ]; then
    # The RDMA device on the same PCI function as the interface.
    nd_pci=$(readlink -f "$sysfs/class/net/$netdev/device")
    for d in "$sysfs"/class/infiniband/*; do
        [ -e "$d/device" ] || continue
        if [ "$(readlink -f "$d/device")" = "$nd_pci" ]; then
            device=$(basename "$d")
        fi
    done
fi

echo "roce-setup: $netdev${device:+ ($device port $port)}: dscp $dscp, ecn $ecn, priority $prio," \
     "trust $trust, mtu $ib_mtu, traffic class $tclass$([ "$dry_run" -eq 1 ] && echo ', dry run')"

# ---- bookkeeping ----------------------------------------------------------------------------
set_items=()
ok_items=()
failed_items=()

# quote_args ARG...: the words as a shell would need them typed (quoted only where needed).
quote_args() {
    local a out=""
    for a in "$@"; do
        if [[ "$a" =~ ^[A-Za-z0-9_,./:=@%+-]+$ ]]; then
            out+="${out:+ }$a"
        else
            out+="${out:+ }'${a//\'/\'\\\'\'}'"
        fi
    done
    printf '%s\n' "$out"
}

# run WHAT CMD...: runs (or, dry, prints) a command that changes the host, and records it.
# Printed shell-quoted, so a dry run's lines can be pasted as they are.
run() {
    local what=$1 shown
    shift
    shown=$(quote_args "$@")
    if [ "$dry_run" -eq 1 ]; then
        echo "would run: $shown"
        set_items+=("$what (dry run)")
        return 0
    fi
    echo "+ $shown"
    if "$@"; then
        set_items+=("$what")
    else
        failed_items+=("$what: \`$*\` failed (exit $?)")
    fi
}

# write_sysfs WHAT FILE VALUE: writes a sysfs attribute (or, dry, prints the command).
write_sysfs() {
    local what=$1 file=$2 value=$3
    if [ "$dry_run" -eq 1 ]; then
        echo "would run: echo $value > $file"
        set_items+=("$what (dry run)")
        return 0
    fi
    echo "+ echo $value > $file"
    if { printf '%s\n' "$value" >"$file"; } 2>/dev/null; then
        set_items+=("$what")
    else
        failed_items+=("$what: cannot write $file")
    fi
}

already() { ok_items+=("$1"); }
cannot() { failed_items+=("$*"); }
have() { command -v "$1" >/dev/null 2>&1; }

# pfc_list PRIO: "0,0,0,1,0,0,0,0"
pfc_list() {
    local p out=""
    for p in 0 1 2 3 4 5 6 7; do
        out+="${out:+,}$([ "$p" -eq "$1" ] && echo 1 || echo 0)"
    done
    echo "$out"
}

# ---- trust, DSCP map, PFC -------------------------------------------------------------------
want_pfc=$(pfc_list "$prio")
if have mlnx_qos; then
    if ! qos=$(mlnx_qos -i "$netdev" 2>/dev/null); then
        cannot "trust/DSCP map/PFC: \`mlnx_qos -i $netdev\` failed"
    else
        cur_trust=$(sed -n 's/^ *Priority trust [a-z]*: *//p' <<<"$qos" | head -n 1)
        if [ "$cur_trust" = "$trust" ]; then
            already "trust $trust"
        else
            run "trust $trust (was ${cur_trust:-unknown})" mlnx_qos -i "$netdev" --trust "$trust"
        fi
        if [ "$trust" = "dscp" ]; then
            # The priority whose dscp list holds our DSCP ("prio:3 dscp:31,30,...,26,...").
            cur_prio=$(awk -v d="$dscp" '
                /^ *prio:[0-7] dscp:/ {
                    split($1, p, ":"); sub(/^dscp:/, "", $2); n = split($2, l, ",");
                    for (i = 1; i <= n; i++) if (l[i] != "" && l[i] + 0 == d) print p[2]
                }' <<<"$qos" | head -n 1)
            if [ "$cur_prio" = "$prio" ]; then
                already "DSCP $dscp -> priority $prio"
            else
                run "DSCP $dscp -> priority $prio (was ${cur_prio:-unmapped})" \
                    mlnx_qos -i "$netdev" --dscp2prio "set,$dscp,$prio"
            fi
        fi
        cur_pfc=$(awk '/PFC configuration/ {f = 1} f && $1 == "enabled" {
                      $1 = ""; gsub(/^ +| +$/, ""); gsub(/ +/, ","); print; exit }' <<<"$qos")
        if [ "$cur_pfc" = "$want_pfc" ]; then
            already "PFC on priority $prio alone"
        else
            run "PFC on priority $prio alone (was ${cur_pfc:-unknown})" \
                mlnx_qos -i "$netdev" --pfc "$want_pfc"
        fi
    fi
elif have dcb; then
    if trust_out=$(dcb apptrust show dev "$netdev" 2>/dev/null); then
        cur_trust=$(sed -n 's/.*order \([a-z]*\).*/\1/p' <<<"$trust_out" | head -n 1)
        if [ "$cur_trust" = "$trust" ]; then
            already "trust $trust"
        else
            run "trust $trust (was ${cur_trust:-unknown})" dcb apptrust set dev "$netdev" order "$trust"
        fi
    else
        cannot "trust $trust: this iproute2's dcb has no apptrust (iproute2 >= 6.2, or mlnx_qos);" \
               "mlx5 trusts DSCP once a dscp-prio entry exists"
    fi
    if [ "$trust" = "dscp" ]; then
        if app=$(dcb -N app show dev "$netdev" dscp-prio 2>/dev/null); then
            # Every priority our DSCP maps to; exactly "$prio" is right.
            cur=$(tr ' ' '\n' <<<"$app" | sed -n "s/^$dscp:\([0-7]\)\$/\1/p" | sort -u | paste -sd, -)
            if [ "$cur" = "$prio" ]; then
                already "DSCP $dscp -> priority $prio"
            else
                run "DSCP $dscp -> priority $prio (was ${cur:-unmapped})" \
                    dcb app replace dev "$netdev" dscp-prio "$dscp:$prio"
            fi
        else
            cannot "DSCP map: \`dcb -N app show dev $netdev dscp-prio\` failed"
        fi
    fi
    if pfc_out=$(dcb pfc show dev "$netdev" prio-pfc 2>/dev/null); then
        cur_pfc=$(tr ' ' '\n' <<<"$pfc_out" | sed -n 's/^\([0-7]\):\(on\|off\)$/\1 \2/p' |
                  sort -n | awk '{printf "%s%s", (NR > 1 ? "," : ""), ($2 == "on" ? 1 : 0)}')
        if [ "$cur_pfc" = "$want_pfc" ]; then
            already "PFC on priority $prio alone"
        else
            run "PFC on priority $prio alone (was ${cur_pfc:-unknown})" \
                dcb pfc set dev "$netdev" prio-pfc all:off "$prio:on"
        fi
    else
        cannot "PFC: \`dcb pfc show dev $netdev prio-pfc\` failed"
    fi
else
    cannot "trust/DSCP map/PFC: neither mlnx_qos nor dcb is installed (apt-get install iproute2)"
fi

# ---- ECN / DCQCN on the priority (mlx5 sysfs knobs) -----------------------------------------
if [ "$ecn" = "true" ]; then
    for point in np rp; do
        f="$sysfs/class/net/$netdev/ecn/roce_$point/enable/$prio"
        if [ ! -e "$f" ]; then
            cannot "ECN roce_$point on priority $prio: no $f (not an mlx5 interface?)"
        elif [ "$(cat "$f" 2>/dev/null)" = "1" ]; then
            already "ECN roce_$point on priority $prio"
        else
            write_sysfs "ECN roce_$point on priority $prio" "$f" 1
        fi
    done
else
    already "ECN: ecn = false in the file, nothing to enable"
fi

# ---- the host-wide traffic class ------------------------------------------------------------
tc_file="$sysfs/class/infiniband/${device:-DEVICE}/tc/$port/traffic_class"
cur_tc=""
if [ -n "$device" ] && [ -r "$tc_file" ]; then
    cur_tc=$(sed -n 's/^Global tclass=\([0-9]*\).*/\1/p' "$tc_file" | head -n 1)
fi
if [ "$set_tclass" -eq 1 ]; then
    if [ -z "$device" ] || [ ! -e "$tc_file" ]; then
        cannot "traffic class $tclass: no $tc_file (the driver has no host-wide override)"
    elif [ "$cur_tc" = "$tclass" ]; then
        already "host traffic class $tclass"
    else
        write_sysfs "host traffic class $tclass (was ${cur_tc:-unset})" "$tc_file" "$tclass"
    fi
elif [ -n "$cur_tc" ] && [ "$cur_tc" != "$tclass" ]; then
    cannot "host traffic class is $cur_tc, the file's is $tclass: the sidecar will" \
           "$([ "$tclass_policy" = "adopt" ] && echo "adopt $cur_tc" || echo "refuse to start")" \
           "(tclass_override = $tclass_policy); --set-tclass writes $tclass"
else
    already "traffic class $tclass set per QP by the sidecar${cur_tc:+ (host override $cur_tc matches)}"
fi

# ---- MTU ------------------------------------------------------------------------------------
need_mtu=$((ib_mtu + 96))  # RoCEv2 headers, as the kernel's iboe_get_mtu() subtracts them
if [ -z "$netdev_mtu" ]; then
    case "$ib_mtu" in
        4096) netdev_mtu=4200 ;;
        2048) netdev_mtu=2200 ;;
        *) netdev_mtu=1500 ;;
    esac
fi
cur_mtu=$(cat "$sysfs/class/net/$netdev/mtu" 2>/dev/null || true)
if [ -z "$cur_mtu" ]; then
    cannot "MTU: $sysfs/class/net/$netdev/mtu cannot be read"
elif [ "$cur_mtu" -ge "$need_mtu" ]; then
    already "$netdev MTU $cur_mtu (>= $need_mtu for RoCE MTU $ib_mtu)"
elif have ip; then
    run "$netdev MTU $netdev_mtu (was $cur_mtu)" ip link set dev "$netdev" mtu "$netdev_mtu"
else
    cannot "MTU $netdev_mtu: ip (iproute2) is not installed"
fi

# ---- socket buffers (the TCP bootstrap and the tcp transport) -------------------------------
if [ "$do_sysctl" -eq 1 ]; then
    sysctls=(
        "net.core.rmem_max=268435456"
        "net.core.wmem_max=268435456"
        "net.core.rmem_default=16777216"
        "net.core.wmem_default=16777216"
        "net.ipv4.tcp_rmem=4096 131072 268435456"
        "net.ipv4.tcp_wmem=4096 65536 268435456"
        "net.core.netdev_max_backlog=250000"
    )
    if ! have sysctl; then
        cannot "sysctls: sysctl (procps) is not installed"
    else
        for kv in "${sysctls[@]}"; do
            key=${kv%%=*}
            want=${kv#*=}
            if ! cur=$(sysctl -n "$key" 2>/dev/null); then
                cannot "$key: cannot be read"
                continue
            fi
            # sysctl prints tabs between the fields of tcp_rmem: compare word by word.
            if [ "$(echo "$cur" | tr -s ' \t' ' ')" = "$want" ]; then
                already "$key = $want"
            else
                run "$key = $want (was $(echo "$cur" | tr -s ' \t' ' '))" sysctl -q -w "$key=$want"
            fi
        done
    fi
fi

# ---- summary --------------------------------------------------------------------------------
echo
echo "roce-setup summary for $netdev:"
for s in ${set_items[@]+"${set_items[@]}"}; do echo "  set:      $s"; done
for s in ${ok_items[@]+"${ok_items[@]}"}; do echo "  already:  $s"; done
for s in ${failed_items[@]+"${failed_items[@]}"}; do echo "  NOT SET:  $s"; done
echo "  ${#set_items[@]} set, ${#ok_items[@]} already right, ${#failed_items[@]} not set" \
     "$([ "$dry_run" -eq 1 ] && echo '(dry run: nothing was changed)')"
[ "${#failed_items[@]}" -eq 0 ]
