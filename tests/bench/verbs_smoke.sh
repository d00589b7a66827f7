#!/usr/bin/env bash
# bench.verbs_smoke: `tensorlane bench --transport verbs` between two simulated RoCE devices,
# one size, a moment, in the default (adaptive) and the busy poll mode, so the benchmark stays
# runnable. Checks that it ran and reported sane numbers (its JSON parses, the run was over
# verbs on the two devices, latency and bandwidth non-zero); not a timing assertion.
set -euo pipefail

usage() {
    echo "usage: tests/bench/verbs_smoke.sh TENSORLANE_BIN MKSYSFS SIMHCA_DIR" >&2
    exit 2
}
[ "$#" -eq 3 ] || usage
tl=$1 mksysfs=$2 simdir=$3
if [ ! -x "$tl" ] || [ ! -f "$mksysfs" ] || [ ! -e "$simdir/libibverbs.so.1" ]; then
    usage
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Addresses of our own (from the pid): tests running at the same time bind other ports 4791.
net="127.$((1 + ($$ >> 8) % 250)).$(($$ % 250))"
bash "$mksysfs" "$work/sys" --dev sim0 --netdev smoke0 --ip "$net.2" --mtu 4200 >/dev/null
bash "$mksysfs" "$work/sys" --dev sim1 --netdev smoke1 --ip "$net.3" --mtu 4200 >/dev/null

for mode in adaptive busy; do
    LD_LIBRARY_PATH=$simdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$tl" bench --transport verbs --sysfs-root "$work/sys" \
        --devices sim0,sim1 --sizes 64K --iters 20 --duration 0.05 --poll-mode "$mode" \
        --no-baseline --json "$work/$mode.json" >"$work/$mode.txt"
    python3 - "$work/$mode.json" "$mode" <<'PY'
import json, sys

with open(sys.argv[1]) as f:
    j = json.load(f)
mode = sys.argv[2]
assert j["transport"] == "verbs", j.get("transport")
assert j["devices"] == "sim0,sim1", j.get("devices")
assert j["poll_mode"] == mode, j.get("poll_mode")
[r] = j["results"]
assert r["bytes"] == 65536, r
lat, bw = r["latency"], r["bandwidth"]
assert lat["iters"] >= 1 and 0 < lat["min_us"] <= lat["p50_us"] <= lat["p99_us"], lat
assert bw["writes"] >= 1 and bw["bytes"] == bw["writes"] * 65536 and bw["gbps"] > 0, bw
print(f"{mode}: 64 KiB round trip p50 {lat['p50_us']:.1f} us over {lat['iters']} iterations, "
      f"{bw['gbps']:.3f} GB/s over {bw['writes']} writes")
PY
done
