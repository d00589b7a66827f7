#!/usr/bin/env bash
# Checks tensorlane on a real RoCE pair against perftest, as perftest is run: one host is the
# server (--server), the other the client (--peer HOST); run the same command line on both,
# the server first. On each host, in this order:
#   1. `tensorlane diag --config FILE` (the fabric as the sidecar sees it; without its peer
#      probe unless --attach, since this host's sidecar starts only in step 3);
#   2. perftest's ib_write_lat (64 B) and ib_write_bw (64 KiB up) over the device, port, GID index
#      and traffic class the TOML resolves to (`tensorlane-sidecar --check-config FILE --json`);
#   3. `tensorlane bench` over the same device: a sidecar started from the same TOML (or the one
#      running, --attach); the server runs `tensorlane bench --respond`, the client the bench;
#   4. the simulated HCA's conformance suite against the real device (the simulator-only tests
#      skip), QPs looped through the HCA.
# The client prints the ratios side by side with the goals on hardware: a 64 B write-to-
# notification within 1 us of ib_write_lat (both one-way, i.e. half the round trip) and at
# least 95% of ib_write_bw from 64 KiB up.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/hw-check.sh --config FILE (--server | --peer HOST) [options]

  --config FILE        this node's TOML: [fabric] device, port, gid_index, dscp/ecn (traffic
                       class), qps_per_peer; [node] name and socket; [[peers]] (the other host)
  --server             be perftest's server and the bench's responder (start this one first)
  --peer HOST          be the client: HOST is the server's address (perftest's TCP exchange)
  --peer-node NAME     the other host's [node] name (default: the [[peers]] entry whose address
                       is HOST, else the only [[peers]] entry)
  --build-dir DIR      where tensorlane, tensorlane-sidecar and simhca_conformance were built
                       (default build/release)
  --port N             perftest's TCP port; each test takes the next one (default 18600)
  --iters N            latency round trips, both tools (default 10000)
  --sizes "S ..."      bandwidth sizes in bytes (default "65536 262144 1048576 4194304")
  --bw-iters N         ib_write_bw's -n per size (default 5000)
  --window N           writes in flight: ib_write_bw's -t and the bench's --window (default 128)
  --duration S         the bench's seconds per bandwidth size (default 2)
  --attach             bench against the sidecar already running on the TOML's socket
                       (default: start one from the TOML for step 3, stop it after)
  --skip-diag, --skip-perftest, --skip-bench, --skip-conformance
                       leave that step out (the other host must leave out the same)
  --conformance-filter PATTERN  a gtest filter for the conformance suite
  --out DIR            keep every output there (default: a temp dir, removed)
  --dry-run            print every command, run none (but --check-config, which only reads)
  -h, --help           this text

Needs perftest (ib_write_lat, ib_write_bw) and python3. Exit status: 0 when every step ran
(goals met or not: the figures are the result), 1 when a step failed, 2 on a usage or
config error.
USAGE
}

die() {
    echo "hw-check: $*" >&2
    exit 2
}

config=""
role=""
peer_host=""
peer_node=""
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$root/build/release"
port=18600
iters=10000
sizes="65536 262144 1048576 4194304"
bw_iters=5000
window=128
duration=2
attach=0
do_diag=1
do_perftest=1
do_bench=1
do_conformance=1
conformance_filter=""
out=""
dry_run=0
while [ "$#" -gt 0 ]; do
    case "$1" in
        --config) config=${2:?--config needs a FILE}; shift ;;
        --server) [ -z "$role" ] || die "--server and --peer exclude each other"; role=server ;;
        --peer)
            [ -z "$role" ] || die "--server and --peer exclude each other"
            role=client; peer_host=${2:?--peer needs a HOST}; shift ;;
        --peer-node) peer_node=${2:?--peer-node needs a NAME}; shift ;;
        --build-dir) build=$(realpath -m "${2:?--build-dir needs a DIR}"); shift ;;
        --port) port=${2:?}; shift ;;
        --iters) iters=${2:?}; shift ;;
        --sizes) sizes=${2:?}; shift ;;
        --bw-iters) bw_iters=${2:?}; shift ;;
        --window) window=${2:?}; shift ;;
        --duration) duration=${2:?}; shift ;;
        --attach) attach=1 ;;
        --skip-diag) do_diag=0 ;;
        --skip-perftest) do_perftest=0 ;;
        --skip-bench) do_bench=0 ;;
        --skip-conformance) do_conformance=0 ;;
        --conformance-filter) conformance_filter=${2:?}; shift ;;
        --out) out=${2:?}; shift ;;
        --dry-run) dry_run=1 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
    shift
done
[ -n "$config" ] || { usage >&2; die "--config FILE is required"; }
[ -r "$config" ] || die "cannot read $config"
[ -n "$role" ] || { usage >&2; die "say which side this is: --server, or --peer HOST"; }
for n in "$port" "$iters" "$bw_iters" "$window"; do
    [[ $n =~ ^[0-9]+$ && $n -gt 0 ]] || die "expected a positive integer, got '$n'"
done
[[ $duration =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--duration: seconds, not '$duration'"
for s in $sizes; do
    [[ $s =~ ^[0-9]+$ && $s -gt 0 ]] || die "--sizes: expected byte counts, got '$s'"
done
command -v python3 >/dev/null || die "python3 is needed (to read the check-config JSON)"

tl="$build/sidecar/tensorlane"
sidecar="$build/sidecar/tensorlane-sidecar"
conformance="$build/tests/simhca/test/simhca_conformance"
[ -x "$sidecar" ] || die "no $sidecar (build it, or pass --build-dir)"
if [ "$dry_run" -eq 0 ]; then
    [ -x "$tl" ] || die "no $tl (build it, or pass --build-dir)"
    if [ "$do_perftest" -eq 1 ]; then
        for prog in ib_write_lat ib_write_bw; do
            command -v "$prog" >/dev/null || die "$prog is not installed (apt-get install perftest)"
        done
    fi
    if [ "$do_conformance" -eq 1 ] && [ ! -x "$conformance" ]; then
        die "no $conformance (build the simhca_conformance target, or --skip-conformance)"
    fi
fi

# ---- what the TOML resolves to ----------------------------------------------------------------
set +e
json=$("$sidecar" --check-config "$config" --json 2>/dev/null)
check_rc=$?
set -e
if [ "$check_rc" -ne 0 ] || [ -z "$json" ]; then
    echo "hw-check: $sidecar --check-config $config --json failed (exit $check_rc):" >&2
    "$sidecar" --check-config "$config" >&2 || true
    exit 2
fi
# resolved: prints KEY=VALUE lines for the settings every step shares.
resolved() {
    python3 -c '
import json, sys
role, peer_host, peer_node = sys.argv[1], sys.argv[2], sys.argv[3]
j = json.loads(sys.stdin.read())
sel = j.get("fabric_selection") or {}
def fail(msg):
    print(f"error={msg}")
    sys.exit(0)
if j["derived"].get("transport") != "verbs":
    fail("the TOML resolves to transport " + str(j["derived"].get("transport")) +
         ", not verbs: " + str(j["derived"].get("transport_reason")))
if not sel.get("device"):
    fail("the fabric selection failed: " + str(sel.get("error", "no RDMA device")))
peers = j.get("peers") or []
if not peer_node:
    hits = [p["name"] for p in peers if peer_host and p["address"].rsplit(":", 1)[0] == peer_host]
    if len(hits) == 1:
        peer_node = hits[0]
    elif len(peers) == 1:
        peer_node = peers[0]["name"]
    else:
        fail("cannot tell which [[peers]] entry is the other host; pass --peer-node NAME")
elif peer_node not in [p["name"] for p in peers]:
    fail(f"[[peers]] has no {peer_node}")
for k, v in (("device", sel["device"]), ("ibport", sel["port"]), ("gid", sel["gid_index"]),
             ("gid_text", sel.get("gid_address") or sel.get("gid")),
             ("tclass", sel["traffic_class"]), ("qps", j["fabric"]["qps_per_peer"]),
             ("socket", j["node"]["socket"]), ("node", j["node"]["name"]),
             ("peer_node", peer_node)):
    print(f"{k}={v}")
' "$role" "$peer_host" "$peer_node" <<<"$json"
}
device="" ibport="" gid="" gid_text="" tclass="" qps="" socket="" node="" error=""
while IFS='=' read -r k v; do
    case "$k" in
        device) device=$v ;; ibport) ibport=$v ;; gid) gid=$v ;; gid_text) gid_text=$v ;;
        tclass) tclass=$v ;; qps) qps=$v ;; socket) socket=$v ;; node) node=$v ;;
        peer_node) peer_node=$v ;; error) error=$v ;;
    esac
done < <(resolved)
[ -z "$error" ] || die "$config: $error"
echo "hw-check: $role $node (peer $peer_node${peer_host:+ at $peer_host}): $device port $ibport," \
     "GID index $gid ($gid_text), traffic class $tclass, $qps QPs per peer" \
     "$([ "$dry_run" -eq 1 ] && echo '(dry run: commands are printed, not run)')"

if [ -n "$out" ]; then
    mkdir -p "$out"
    work=$(cd "$out" && pwd)
    keep=1
else
    work=$(mktemp -d /tmp/tensorlane-hw-check.XXXXXX)
    keep=0
fi
sidecar_pid=""
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    if [ -n "$sidecar_pid" ]; then
        kill "$sidecar_pid" 2>/dev/null || true
        wait "$sidecar_pid" 2>/dev/null || true
    fi
    if [ "$keep" -eq 0 ]; then
        rm -rf "$work"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# show CMD...: prints the command as it would be typed (words with other characters than
# these quoted).
show() {
    local a line="+"
    for a in "$@"; do
        if [[ $a =~ ^[A-Za-z0-9_./=:,@%+-]+$ ]]; then
            line+=" $a"
        else
            line+=" $(printf '%q' "$a")"
        fi
    done
    echo "$line"
}
# run OUTFILE CMD...: prints it, then (not in a dry run) runs it with its output in OUTFILE.
run() {
    local file=$1
    shift
    show "$@"
    [ "$dry_run" -eq 1 ] && return 0
    "$@" >"$file" 2>&1
}
failed=0
step_failed() {
    echo "hw-check: $1 failed; its output:" >&2
    cat "$2" >&2 || true
    failed=1
}

# ---- 1. diag --------------------------------------------------------------------------------
if [ "$do_diag" -eq 1 ]; then
    echo "== tensorlane diag"
    diag_rc=0
    # The peer probe needs this host's sidecar, which step 3 starts only later (unless
    # --attach): without one diag would only warn that no sidecar answers. Step 3's bench is
    # the write-with-immediate to the peer that the probe stands for.
    diag_args=(diag --config "$config")
    if [ "$attach" -eq 0 ]; then
        diag_args+=(--no-probe)
        echo "(no peer probe: no sidecar runs yet; step 3's bench writes to the peer)"
    fi
    run "$work/diag.txt" "$tl" "${diag_args[@]}" || diag_rc=$?
    if [ "$dry_run" -eq 0 ]; then
        cat "$work/diag.txt"
        # 1: a finding failed (the figures below may show why); anything else: diag broke.
        if [ "$diag_rc" -ne 0 ] && [ "$diag_rc" -ne 1 ]; then
            step_failed "tensorlane diag (exit $diag_rc)" "$work/diag.txt"
        fi
    fi
fi

# ---- 2. perftest ----------------------------------------------------------------------------
# perftest PROG OUTFILE ARGS...: the server waits for one client; the client retries until the
# server listens (it may still be finishing the previous test).
next_port=$port
perftest() {
    local prog=$1 file=$2 tries=0 rc
    shift 2
    local args=("$prog" -F -d "$device" -i "$ibport" -x "$gid" --tclass "$tclass" -p "$next_port" "$@")
    next_port=$((next_port + 1))
    if [ "$role" = server ]; then
        run "$file" "${args[@]}" || step_failed "$prog (server)" "$file"
        return 0
    fi
    show "${args[@]}" "$peer_host"
    [ "$dry_run" -eq 1 ] && return 0
    until "${args[@]}" "$peer_host" >"$file" 2>&1; do
        rc=$?
        tries=$((tries + 1))
        if [ "$tries" -ge 30 ]; then
            step_failed "$prog (client, exit $rc, 30 tries)" "$file"
            return 0
        fi
        sleep 1
    done
}
if [ "$do_perftest" -eq 1 ]; then
    echo "== perftest over $device port $ibport, GID index $gid, traffic class $tclass"
    perftest ib_write_lat "$work/lat.perftest.txt" -s 64 -n "$iters"
    for s in $sizes; do
        perftest ib_write_bw "$work/bw.perftest.$s.txt" -s "$s" -n "$bw_iters" -q "$qps" -t "$window"
    done
fi

# ---- 3. tensorlane bench ----------------------------------------------------------------------
bw_list=$(tr ' ' ',' <<<"$sizes")
# bench TAG OUTFILE ARGS...: one phase (its own region names on both hosts).
bench() {
    local tag=$1 file=$2
    shift 2
    if [ "$role" = server ]; then
        run "$file" "$tl" bench --respond --socket "$socket" --peer "$peer_node" --tag "$tag" "$@" ||
            step_failed "tensorlane bench --respond ($tag)" "$file"
    else
        run "$file" "$tl" bench --socket "$socket" --peer "$peer_node" --tag "$tag" --no-baseline \
            --json "$work/$tag.json" "$@" || step_failed "tensorlane bench ($tag)" "$file"
    fi
}
if [ "$do_bench" -eq 1 ]; then
    echo "== tensorlane bench over the same device (sidecar: $config)"
    if [ "$attach" -eq 0 ]; then
        [ -S "$socket" ] && die "a sidecar already listens on $socket: stop it, or pass --attach"
        echo "$(show "$sidecar" --config "$config") &"
        if [ "$dry_run" -eq 0 ]; then
            "$sidecar" --config "$config" 2>"$work/sidecar.log" &
            sidecar_pid=$!
            for _ in $(seq 100); do
                [ -S "$socket" ] && break
                kill -0 "$sidecar_pid" 2>/dev/null || break
                sleep 0.1
            done
            [ -S "$socket" ] || { step_failed "tensorlane-sidecar" "$work/sidecar.log"; exit 1; }
        fi
    fi
    bench hwcheck-lat "$work/bench.lat.txt" --test lat --sizes 64 --iters "$iters" --duration 60
    bench hwcheck-bw "$work/bench.bw.txt" --test bw --sizes "$bw_list" --window "$window" \
        --duration "$duration"
    if [ -n "$sidecar_pid" ]; then
        show kill "$sidecar_pid"
        kill "$sidecar_pid" 2>/dev/null || true
        wait "$sidecar_pid" 2>/dev/null || true
        sidecar_pid=""
    fi
fi

# ---- 4. conformance suite ---------------------------------------------------------------------
if [ "$do_conformance" -eq 1 ]; then
    echo "== the simulated HCA's conformance suite against $device (GID index $gid)"
    args=(env "SIMHCA_CONFORMANCE_DEVICE=$device" "SIMHCA_CONFORMANCE_GID_INDEX=$gid" "$conformance")
    [ -z "$conformance_filter" ] || args+=("--gtest_filter=$conformance_filter")
    if run "$work/conformance.txt" "${args[@]}"; then
        [ "$dry_run" -eq 1 ] || grep -E '^\[  (PASSED|SKIPPED) ' "$work/conformance.txt" || true
    else
        step_failed "the conformance suite" "$work/conformance.txt"
    fi
fi

# ---- the figures, side by side (the client measured them) -------------------------------------
if [ "$dry_run" -eq 0 ] && [ "$role" = client ]; then
    python3 - "$work" "$sizes" "$do_perftest" "$do_bench" <<'PY'
import json, os, sys

work, sizes = sys.argv[1], [int(s) for s in sys.argv[2].split()]
have = sys.argv[3] == "1" and sys.argv[4] == "1"

def row(path):
    """The numbers of the row after perftest's '#bytes' header line, or None."""
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return None
    for i, line in enumerate(lines):
        if line.strip().startswith("#bytes") and i + 1 < len(lines):
            try:
                return [float(x) for x in lines[i + 1].split()]
            except ValueError:
                return None
    return None

def load(name):
    try:
        with open(os.path.join(work, name)) as f:
            return json.load(f)["results"]
    except (OSError, ValueError, KeyError):
        return None

if not have:
    sys.exit(0)
print("\n== tensorlane vs perftest, same device, GID and traffic class")
lat, tl = row(os.path.join(work, "lat.perftest.txt")), load("hwcheck-lat.json")
if lat and tl:
    # ib_write_lat reports half the round trip (t_typical: the median); tensorlane bench the
    # whole round trip (write, peer notified, echo, notified): halved here, like for like.
    mine = tl[0]["latency"]["p50_us"] / 2
    diff = mine - lat[4]
    print(f"64 B one-way (RTT/2), median: ib_write_lat {lat[4]:.2f} us, tensorlane {mine:.2f} us: "
          f"{diff:+.2f} us, {mine / lat[4]:.2f}x  (goal: within 1 us: "
          f"{'met' if diff <= 1.0 else 'MISSED'})")
else:
    print("64 B latency: a figure is missing (see the outputs above)")
bw = {r["bytes"]: r["bandwidth"]["gbps"] * 1e9 / (1 << 20) for r in (load("hwcheck-bw.json") or [])}
ok = True
print(f"{'size':>9} {'ib_write_bw MiB/s':>18} {'tensorlane MiB/s':>17} {'ratio':>7}")
for s in sizes:
    p = row(os.path.join(work, f"bw.perftest.{s}.txt"))
    if p is None or s not in bw:
        print(f"{s:>9} a figure is missing")
        ok = False
        continue
    ratio = bw[s] / p[3]
    ok = ok and (s < 65536 or ratio >= 0.95)
    print(f"{s:>9} {p[3]:18.1f} {bw[s]:17.1f} {100 * ratio:6.0f}%")
print(f"bandwidth goal (at least 95% of ib_write_bw from 64 KiB up): {'met' if ok else 'MISSED'}")
PY
fi
if [ "$keep" -eq 1 ]; then
    echo "hw-check: outputs in $work"
fi
exit "$failed"
