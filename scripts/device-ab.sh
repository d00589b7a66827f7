#!/usr/bin/env bash
# An A/B of nccl_plugin_bench on the GPU machine: an earlier commit's build against this
# tree's, alternated in one call (the machine is shared and moves between calls).
#   here:   scripts/device-ab.sh pack REV          # REV's sources into out/old.tgz (git-ignored)
#   there:  scripts/device-ab.sh run [PAIRS [BENCH ARGS...]]
#           with carry [".debs", ".debs-net", "out"]: builds both (device-run.sh's prefix of
#           .debs), then runs old, new, old, new, ... PAIRS times (default 2), each output also
#           in $OUT/{old,new}N.txt (on the device machine, all of $OUT in $OUT/ab.tgz at the end:
#           it returns few files a call)
#   AB_NCCL="ARGS" (environment, without --net): then also tests/nccl/torch_collectives.py ARGS
#           under CUDA MPS, NCCL's Socket transport and then each build's plugin and sidecar,
#           alternated the same way ($OUT/nccl-{socket,old,new}N.*)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
case "${1:-}" in
    pack)
        [ -n "${2:-}" ] || { echo "usage: $0 pack REV" >&2; exit 2; }
        mkdir -p out
        git archive --format=tar.gz -o out/old.tgz "$2"
        echo "out/old.tgz: $(git rev-parse --short "$2")"
        ;;
    run)
        pairs=${2:-2}
        shift $(( $# >= 2 ? 2 : 1 ))
        args=("$@")
        [ "${#args[@]}" -gt 0 ] || args=(--sizes "4096,65536,131072,524288" --iters 1000 --rounds 3)
        out=${OUT:-/tmp/tensorlane-ab}
        mkdir -p "$out"
        [ -f out/old.tgz ] || { echo "no out/old.tgz: run '$0 pack REV' first" >&2; exit 2; }
        # This tree's build; it also unpacks the .debs into device-run.sh's prefix.
        targets=nccl_plugin_bench
        [ -z "${AB_NCCL:-}" ] ||
            targets="$targets tensorlane-sidecar tensorlane tensorlane-python nccl_net_tensorlane"
        scripts/device-run.sh run --no-gpu --no-rest --budget 200 --targets "$targets" \
            --out "$out/new-build" >/dev/null 2>&1 || { echo "the new build failed" >&2; exit 1; }
        prefix=/tmp/tensorlane-deps
        export CMAKE_PREFIX_PATH="$prefix/usr"
        export PKG_CONFIG_PATH="$prefix/usr/lib/x86_64-linux-gnu/pkgconfig:$prefix/usr/share/pkgconfig"
        export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        export PATH="$prefix/usr/bin:$PATH"
        old=/tmp/tensorlane-ab-old
        rm -rf "$old" && mkdir -p "$old" && tar xzf out/old.tgz -C "$old"
        # shellcheck disable=SC2086 # the targets are words
        (cd "$old" && cmake --preset release && cmake --build build/release -j "$(nproc)" \
            --target $targets) >"$out/old-build.log" 2>&1 ||
            { echo "the old build failed (old-build.log)" >&2; exit 1; }
        bench=build/release/tests/bench/nccl_plugin_bench
        for i in $(seq 1 "$pairs"); do
            for t in old new; do
                bin=$bench
                [ "$t" = old ] && bin=$old/$bench
                echo "== $t $i"
                timeout 150 "$bin" "${args[@]}" 2>&1 | tee "$out/$t$i.txt" ||
                    echo "($t $i: exit $?; the A/B goes on)"
            done
        done
        if [ -n "${AB_NCCL:-}" ]; then
            read -ra nccl_args <<<"$AB_NCCL"
            mps=$(mktemp -d)
            mkdir -p "$mps/pipe" "$mps/log"
            export CUDA_MPS_PIPE_DIRECTORY="$mps/pipe" CUDA_MPS_LOG_DIRECTORY="$mps/log"
            export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
            nvidia-cuda-mps-control -d
            for i in $(seq 1 "$pairs"); do
                for t in socket old new; do
                    tree=$root
                    [ "$t" = old ] && tree=$old
                    net=tensorlane
                    [ "$t" = socket ] && net=socket
                    echo "== nccl $t $i"
                    rc=0  # a failed run is reported, and the A/B goes on (set -e)
                    LD_LIBRARY_PATH="$tree/build/release/shim:$LD_LIBRARY_PATH" \
                        PYTHONPATH="$tree/build/release/python${PYTHONPATH:+:$PYTHONPATH}" \
                        TENSORLANE_SIDECAR="$tree/build/release/sidecar/tensorlane-sidecar" \
                        timeout 120 python3 tests/nccl/torch_collectives.py --net "$net" \
                        "${nccl_args[@]}" --out "$out/nccl-$t$i.json" >"$out/nccl-$t$i.txt" \
                        2>"$out/nccl-$t$i.err" || rc=$?
                    echo "exit $rc; $(tail -n 1 "$out/nccl-$t$i.err")"
                    python3 - "$out/nccl-$t$i.txt" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        print(f"  {r['op']:14} {r['bytes']:>10} B {r['us']:>11.1f} us {r['algbw_GBps']:7.3f} GB/s")
PY
                done
            done
            echo quit | nvidia-cuda-mps-control
        fi
        if [ -n "${OUT:-}" ]; then
            # The device machine returns only a few files a call: everything in one archive.
            archive=$(mktemp /tmp/tensorlane-ab.XXXXXX)
            tar czf "$archive" -C "$out" . &&
                find "$out" -mindepth 1 -maxdepth 1 -exec rm -rf {} + &&
                mv "$archive" "$OUT/ab.tgz"
        fi
        ;;
    *)
        sed -n '2,9p' "$0" >&2
        exit 2
        ;;
esac
