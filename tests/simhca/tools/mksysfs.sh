#!/usr/bin/env bash
# Writes a sysfs-shaped tree describing one simulated RoCE device, in the layout of /sys
# (Documentation/ABI/stable/sysfs-class-infiniband, sysfs-class-net), for the simulated HCA
# (tests/simhca), the sidecar's fabric discovery and `tensorlane diag --sysfs-root`.
# Call it once per device; several devices may share one ROOT (one host), or use one ROOT per
# simulated node.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: tests/simhca/tools/mksysfs.sh ROOT --dev NAME --netdev NAME --ip A.B.C.D [options]

Writes ROOT/class/infiniband/NAME/... and ROOT/class/net/NETDEV/... for one simulated
RoCE device with one port. Point TENSORLANE_SYSFS_ROOT at ROOT.

required:
  --dev NAME            RDMA device name (class/infiniband/NAME), e.g. sim0 or mlx5_0
  --netdev NAME         netdev behind port 1 (class/net/NAME), e.g. eth0
  --ip A.B.C.D          IPv4 address of the netdev: GID ::ffff:A.B.C.D, RoCE v2, at
                        --gid-index; the simulator binds UDP A.B.C.D:4791 for it
options:
  --port-state STATE    ACTIVE (default) or DOWN: ports/1/state and phys_state
  --mtu N               netdev MTU (default 1500); the port's active MTU follows it as on
                        real RoCE ports: the largest IB MTU <= N - 96 (1500 -> 1024,
                        4200 -> 4096, 9000 -> 4096)
  --gid-index K         where the IPv4 RoCE v2 GID goes (default 3, as on mlx5: 0/1 are the
                        link-local GID as RoCE v1/v2, 2/3 the IPv4 GID as RoCE v1/v2)
  --gid-table-size N    entries in the GID table (default 16; empty ones read as zeros)
  --tclass N            write tc/1/traffic_class = "Global tclass=N" (a host-wide traffic
                        class override, as MLNX_OFED's; the simulator then uses it on the wire)
  --node-guid HEX       16 hex digits (default derived from the IP)
  --rate TEXT           ports/1/rate (default "100 Gb/sec (4X EDR)")
  --fw-ver TEXT         fw_ver (default 1.0.0)
  --mac XX:..:XX        netdev address (default 02:00 + the IP's bytes)
  --operstate STATE     class/net/NETDEV/operstate (default: up when ACTIVE, down when DOWN)
  --pci BDF             put the device on the PCI bus, as a real NIC is: a PCI function
                        devices/pci0000:00/0000:00:01.0/BDF (class 0x020000, NUMA node 0)
                        that class/infiniband/NAME/device and class/net/NETDEV/device link to
                        (default: device/ is a plain directory, on no bus)
  -h, --help            this text

Files written (all in the kernel's formats):
  class/infiniband/NAME/{node_guid,sys_image_guid,fw_ver,hca_type,hw_rev,node_type,
      node_desc,board_id,device/vendor,device/device}
  class/infiniband/NAME/ports/1/{state,phys_state,link_layer,rate,lid,sm_lid,lid_mask_count,
      cap_mask,pkeys/0,gids/<i>,gid_attrs/types/<i>,gid_attrs/ndevs/<i>,hw_counters/<name>}
  class/infiniband/NAME/tc/1/traffic_class            (with --tclass)
  class/net/NETDEV/{mtu,operstate,address,ifindex,type}
Re-running for the same NAME rewrites the files in place, so a test can flip
--port-state or change --ip and the simulator raises PORT_ERR/PORT_ACTIVE/GID_CHANGE.
USAGE
}

die() {
    echo "mksysfs: $*" >&2
    exit 2
}

[ $# -ge 1 ] || { usage >&2; exit 2; }
case "$1" in -h|--help) usage; exit 0 ;; esac
root=$1
shift
dev="" netdev="" ip="" state=ACTIVE mtu=1500 gid_index=3 gid_size=16 tclass=""
node_guid="" rate="100 Gb/sec (4X EDR)" fw_ver="1.0.0" mac="" operstate="" pci=""
while [ $# -gt 0 ]; do
    case "$1" in
        --dev) dev=${2:?}; shift 2 ;;
        --netdev) netdev=${2:?}; shift 2 ;;
        --ip) ip=${2:?}; shift 2 ;;
        --port-state) state=${2:?}; shift 2 ;;
        --mtu) mtu=${2:?}; shift 2 ;;
        --gid-index) gid_index=${2:?}; shift 2 ;;
        --gid-table-size) gid_size=${2:?}; shift 2 ;;
        --tclass) tclass=${2:?}; shift 2 ;;
        --node-guid) node_guid=${2:?}; shift 2 ;;
        --rate) rate=${2:?}; shift 2 ;;
        --fw-ver) fw_ver=${2:?}; shift 2 ;;
        --mac) mac=${2:?}; shift 2 ;;
        --operstate) operstate=${2:?}; shift 2 ;;
        --pci) pci=${2:?}; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done
[ -n "$dev" ] || die "--dev is required"
[ -n "$netdev" ] || die "--netdev is required"
[ -n "$ip" ] || die "--ip is required"
[[ "$ip" =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$ ]] || die "bad --ip: $ip"
o1=${BASH_REMATCH[1]} o2=${BASH_REMATCH[2]} o3=${BASH_REMATCH[3]} o4=${BASH_REMATCH[4]}
for o in "$o1" "$o2" "$o3" "$o4"; do [ "$o" -le 255 ] || die "bad --ip: $ip"; done
case "$state" in ACTIVE|DOWN) ;; *) die "--port-state must be ACTIVE or DOWN" ;; esac
is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }
if ! is_uint "$mtu" || [ "$mtu" -lt 576 ]; then die "bad --mtu: $mtu"; fi
if ! is_uint "$gid_size" || [ "$gid_size" -lt 1 ]; then die "bad --gid-table-size"; fi
if ! is_uint "$gid_index" || [ "$gid_index" -ge "$gid_size" ]; then
    die "--gid-index must be below --gid-table-size"
fi
if [ -n "$tclass" ] && { ! is_uint "$tclass" || [ "$tclass" -gt 255 ]; }; then
    die "bad --tclass: $tclass"
fi
if [ -n "$pci" ] && ! [[ "$pci" =~ ^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$ ]]; then
    die "bad --pci: $pci (want DDDD:BB:SS.F, lower-case hex)"
fi

hex2() { printf '%02x' "$1"; }
ipv4_hex="$(hex2 "$o1")$(hex2 "$o2"):$(hex2 "$o3")$(hex2 "$o4")"
[ -n "$mac" ] || mac="02:00:$(hex2 "$o1"):$(hex2 "$o2"):$(hex2 "$o3"):$(hex2 "$o4")"
if [ -z "$node_guid" ]; then
    node_guid="0200$(hex2 "$o1")ff$(hex2 "$o2")$(hex2 "$o3")fe$(hex2 "$o4")"
fi
[[ "$node_guid" =~ ^[0-9a-fA-F]{16}$ ]] || die "bad --node-guid: $node_guid"
guid_text="${node_guid:0:4}:${node_guid:4:4}:${node_guid:8:4}:${node_guid:12:4}"
# The link-local GID from the MAC (EUI-64), as the kernel's roce_gid_mgmt adds it.
IFS=: read -r m1 m2 m3 m4 m5 m6 <<<"$mac"
m1x=$(printf '%02x' $((0x$m1 ^ 2)))
ll_gid="fe80:0000:0000:0000:${m1x}${m2}:${m3}ff:fe${m4}:${m5}${m6}"
v4_gid="0000:0000:0000:0000:0000:ffff:${ipv4_hex}"
zero_gid="0000:0000:0000:0000:0000:0000:0000:0000"

ib="$root/class/infiniband/$dev"
port="$ib/ports/1"
net="$root/class/net/$netdev"
mkdir -p "$ib" "$net"
if [ -n "$pci" ]; then
    # The NIC's PCI function, and both of its class entries' device links to it.
    fn="$root/devices/pci0000:00/0000:00:01.0/$pci"
    mkdir -p "$fn"
    printf '%s\n' 0x020000 >"$fn/class"
    printf '%s\n' 0 >"$fn/numa_node"
    [ -L "$ib/device" ] || ln -s "../../../devices/pci0000:00/0000:00:01.0/$pci" "$ib/device"
    [ -L "$net/device" ] || ln -s "../../../devices/pci0000:00/0000:00:01.0/$pci" "$net/device"
fi
mkdir -p "$ib/device" "$port/gids" "$port/gid_attrs/types" "$port/gid_attrs/ndevs" \
    "$port/pkeys" "$port/hw_counters"

put() { printf '%s\n' "$2" >"$1"; }

put "$ib/node_guid" "$guid_text"
put "$ib/sys_image_guid" "$guid_text"
put "$ib/fw_ver" "$fw_ver"
put "$ib/hca_type" "SIMHCA"
put "$ib/hw_rev" "0x0"
put "$ib/node_type" "1: CA"
put "$ib/node_desc" "$(hostname 2>/dev/null || echo host) $dev"
put "$ib/board_id" "SIM0000000001"
put "$ib/device/vendor" "0x0000"
put "$ib/device/device" "0x0000"

if [ "$state" = ACTIVE ]; then
    put "$port/state" "4: ACTIVE"
    put "$port/phys_state" "5: LinkUp"
    [ -n "$operstate" ] || operstate=up
else
    put "$port/state" "1: DOWN"
    put "$port/phys_state" "3: Disabled"
    [ -n "$operstate" ] || operstate=down
fi
put "$port/link_layer" "Ethernet"
put "$port/rate" "$rate"
put "$port/lid" "0x0"
put "$port/sm_lid" "0x0"
put "$port/lid_mask_count" "0"
put "$port/cap_mask" "0x04010000"
put "$port/pkeys/0" "0xffff"

# GID table: empty entries read as zeros and have no type (the kernel's read fails).
for ((i = 0; i < gid_size; i++)); do
    gid=$zero_gid type=""
    if [ "$i" -eq "$gid_index" ]; then
        gid=$v4_gid type="RoCE v2"
    elif [ "$i" -eq $((gid_index - 1)) ]; then
        gid=$v4_gid type="IB/RoCE v1"
    elif [ "$gid_index" -ge 3 ] && [ "$i" -eq 0 ]; then
        gid=$ll_gid type="IB/RoCE v1"
    elif [ "$gid_index" -ge 3 ] && [ "$i" -eq 1 ]; then
        gid=$ll_gid type="RoCE v2"
    fi
    put "$port/gids/$i" "$gid"
    if [ -n "$type" ]; then
        put "$port/gid_attrs/types/$i" "$type"
        put "$port/gid_attrs/ndevs/$i" "$netdev"
    else
        rm -f "$port/gid_attrs/types/$i" "$port/gid_attrs/ndevs/$i"
    fi
done

counters=(out_of_sequence packet_seq_err local_ack_timeout_err rnr_nak_retry_err
    duplicate_request implied_nak_seq_err rx_write_requests rx_read_requests out_of_buffer
    resp_remote_access_errors req_remote_access_errors req_remote_invalid_request
    resp_local_length_error req_cqe_error resp_cqe_error req_cqe_flush_error
    resp_cqe_flush_error rx_icrc_encapsulated rx_atomic_requests roce_adp_retrans np_cnp_sent
    rp_cnp_handled np_ecn_marked_roce_packets)
for c in "${counters[@]}"; do
    [ -f "$port/hw_counters/$c" ] || put "$port/hw_counters/$c" 0
done

if [ -n "$tclass" ]; then
    mkdir -p "$ib/tc/1"
    put "$ib/tc/1/traffic_class" "Global tclass=$tclass"
else
    rm -rf "$ib/tc"
fi

put "$net/mtu" "$mtu"
put "$net/operstate" "$operstate"
put "$net/address" "$mac"
put "$net/type" "1"
[ -f "$net/ifindex" ] || put "$net/ifindex" "$((100 + $(find "$root/class/net" -mindepth 1 -maxdepth 1 | wc -l)))"
