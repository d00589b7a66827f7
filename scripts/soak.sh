#!/usr/bin/env bash
# Soak and chaos: sidecars over tcp and over verbs on the simulated HCA, workers doing mixed
# traffic through the real shim, and a seeded chaos schedule (workers and sidecars killed with
# SIGKILL and restarted under load, links cut, loss and delay in network namespaces, simulated
# ports flapped, GIDs moved); then the ledger, leak and exit checks (docs/RELIABILITY.md).
# Exit status 0: every invariant held; 1: one broke (said on stderr); 2: could not run;
# 77: not root (skipped).
set -euo pipefail

usage() {
    cat <<USAGE
usage: scripts/soak.sh [--duration SECONDS] [--build-dir DIR] [--seed N] [--dry-run]
                       [--sidecar BIN [--sidecar-nodes N1,N2]] [--keep] [--workdir DIR]
                       [--report FILE] [-- soak.py options]

  --duration S   seconds of load: warm-up, chaos, calm (default 120, the CI smoke;
                 3600 is the 1-hour run); setup and the checks take about 30 s more
  --build-dir D  a build with tensorlane-sidecar, tensorlane, the Python package and the
                 simulated HCA (default build/release)
  --seed N       the chaos schedule's and the traffic's seed (default 1)
  --sidecar BIN  run this tensorlane-sidecar (e.g. an ASan build's) instead of the build's
  --sidecar-nodes N1,N2
                 only these nodes run --sidecar (e.g. tcp1,verbs0), the rest the build's
  --keep         keep the work directory (ledgers, logs, chaos.log, report.json)
  --workdir D    work in D (kept)
  --report F     write the JSON report to F
  --dry-run      say what would run, change nothing
  Everything after -- goes to tests/soak/soak.py (--help lists it: node and worker
  counts, the largest write, the size mix, --overlap, tolerances).
Needs root (it creates network namespaces, removed at the end, even on failure).
USAGE
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
duration=120
build_dir="$root/build/release"
seed=1
dry_run=0
extra=()
while [ "$#" -gt 0 ]; do
    case "$1" in
    --duration) duration=$2; shift 2 ;;
    --build-dir) build_dir=$(cd "$2" && pwd); shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --sidecar | --sidecar-nodes | --workdir | --report) extra+=("$1" "$2"); shift 2 ;;
    --keep) extra+=("$1"); shift ;;
    --dry-run) dry_run=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; extra+=("$@"); break ;;
    *) echo "soak.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
done
case "$duration" in
'' | *[!0-9]*) echo "soak.sh: --duration takes whole seconds, not '$duration'" >&2; exit 2 ;;
esac

for f in "$build_dir/sidecar/tensorlane-sidecar" "$build_dir/sidecar/tensorlane" \
    "$build_dir/python/tensorlane/__init__.py" "$build_dir/tests/simhca/libibverbs.so.1"; do
    if [ ! -e "$f" ]; then
        echo "soak.sh: $f is missing; build it: cmake --preset release && cmake --build" \
            "build/release --target tensorlane-sidecar tensorlane tensorlane-python" \
            "simhca_ibverbs netem_queue" >&2
        exit 2
    fi
done
python=/usr/bin/python3
[ -x "$python" ] || python=python3
# Stream-ordered writes need torch in the workers' interpreter (soak.py starts them with its
# own): where Debian's python3 has none, the first python3 on PATH that has it.
case " ${extra[*]} " in
*" --stream-share "*)
    if ! "$python" -c 'import torch' 2>/dev/null; then
        for p in $(type -ap python3); do
            if "$p" -c 'import torch' 2>/dev/null; then
                python=$p
                break
            fi
        done
    fi
    ;;
esac
cmd=("$python" "$root/tests/soak/soak.py" --duration "$duration" --build-dir "$build_dir"
    --seed "$seed" "${extra[@]}")
# (the namespace tag is added below, once it is drawn)
if [ "$dry_run" -eq 1 ]; then
    echo "would run: PYTHONPATH=$build_dir/python ${cmd[*]}"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "soak.sh: needs root (network namespaces): skipped" >&2
    exit 77
fi
for tool in ip nft; do
    command -v "$tool" >/dev/null || { echo "soak.sh: needs $tool" >&2; exit 2; }
done

# soak.py removes its namespaces and processes itself; this catches a kill of the script:
# the namespaces named with this run's tag (tlsk<tag>...), never another run's.
tag=$(od -An -N2 -tx1 /dev/urandom | tr -d ' \n')
child=""
# shellcheck disable=SC2317  # (run by the trap)
cleanup() {
    if [ -n "$child" ] && kill -0 "$child" 2>/dev/null; then
        kill -TERM "$child" 2>/dev/null || true
        wait "$child" 2>/dev/null || true
    fi
    local ns
    for ns in $(ip netns list | awk '{print $1}' | grep "^tlsk${tag}" || true); do
        ip netns del "$ns" 2>/dev/null || true
    done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

export PYTHONPATH="$build_dir/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
unset TENSORLANE_LIBRARY
rc=0
"${cmd[@]}" --net-tag "$tag" &
child=$!
wait "$child" || rc=$?
child=""
exit "$rc"
