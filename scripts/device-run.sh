#!/usr/bin/env bash
# The GPU machine's run in one call (issue 11): build the release preset there, run the tests
# labelled gpu, the GPU benchmarks, then the rest of the tests, with logs and results in $OUT.
#
# The GPU machine (Ubuntu 24.04, GCC 13, CUDA 13) has no network and lacks some of the
# project's dependencies, so they travel as Debian 12 packages:
#   here:   scripts/device-run.sh fetch          # apt-get download into .debs/ (git-ignored)
#   there:  scripts/device-run.sh run            # with `run`'s carry: [".debs"]
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/device-run.sh fetch
       scripts/device-run.sh run [--out DIR] [--jobs N] [--budget SECONDS] [--bench-min-time S]
                                 [--bench-filter REGEX] [--verbs-bench] [--simhca-bench] [--tcp-compare]
                                 [--latency-rounds N] [--host-latency] [--group-bench] [--vllm-bench]
                                 [--gpu-repeat N] [--nccl "RUN; RUN; ..."] [--nccl-bench "ARGS; ..."] [--tar] [--no-rest]
                                 [--soak "ARGS"]
                                 [--no-gpu] [--verbs-args "ARGS"] [--targets "T1 T2 ..."]
                                 [--gpu-filter REGEX] [--dry-run]

  fetch                download the .debs the GPU machine lacks (toml++, CLI11, nlohmann-json,
                       libsodium, Google Benchmark, prometheus-cpp and civetweb, perftest: -dev
                       and runtime) into .debs/
  run                  unpack them into a prefix, configure and build the release preset, run
                       `ctest -L gpu` (one at a time: a test measures the GPU's free memory),
                       build/release/tests/bench/gpu_bench, then the other tests, within the
                       time budget
  --out DIR            where logs and results go (default: $OUT, else /tmp/tensorlane-device)
  --jobs N             build and test parallelism (default: nproc)
  --budget SECONDS     stop starting steps after this long (default 540: the run tool allows 600)
  --bench-min-time S   Google Benchmark --benchmark_min_time (default 0.2)
  --bench-filter RE    only these benchmarks
  --verbs-bench        after gpu_bench, scripts/bench-verbs.sh (the sidecars' verbs transport
                       against perftest on the simulated HCA; 2 rounds) on this host's cores
  --tcp-compare        gpu_bench's tcp rows again with the tags on the engine thread
                       (TENSORLANE_BENCH_TAG_THREADS=0) and without tags (..._TCP_INTEGRITY=none)
  --latency-rounds N   the 4 KiB latency pair (LocalGpuLatency, CudaMemcpyLatency) N more
                       times, each in a process of its own (the machine moves between runs)
  --host-latency       host round trips through a sidecar, 3 repetitions each: ring_bench's
                       RingNop and LocalWrite/busy/4096, metrics_bench's LocalWrite64 (metrics off, on)
  --group-bench        build/release/tests/bench/group_bench (a 1,000-entry group against one
                       16 MiB write, local and tcp), 3 repetitions
  --vllm-bench         shim/python/bench/vllm_kv.py: KV transfer time per request of the vLLM
                       connector (32 layers x 1,000 blocks) against torch.distributed send/recv
                       (NCCL: two GPUs when there are, else both ranks on one); builds
                       tensorlane-python and tensorlane-sidecar (add them to --targets)
  --soak "ARGS"        scripts/soak.sh ARGS (e.g. "--duration 180 -- --stream-share 0.3": the
                       soak with stream-ordered writes from GPU memory in the mix), its report and
                       the tail of its output into DIR; needs root and the targets tensorlane
                       tensorlane-sidecar tensorlane-python simhca_ibverbs; where the machine has
                       no ip, nft or iptables, Debian's are unpacked from .debs-net (fetch puts
                       them there; carry it too) and put on PATH through wrappers
  --gpu-repeat N       run each gpu test up to N times, stopping at its first failure
  --simhca-bench       tests/simhca/tools/bench.sh: the simulator alone (perftest over it) against
                       UDP ping-pong and stream on the same loopback
  --nccl "RUNS"        tests/nccl/torch_collectives.py (torch.distributed over the NCCL plugin
                       or NCCL's Socket transport), once per ';'-separated RUN: "mps ARGS" or
                       "nomps ARGS" (under CUDA MPS or not), ARGS its own, e.g.
                       "mps --net socket; mps --net tensorlane --poll-mode busy"; @OUT@ in
                       ARGS is the folder that comes back (--log-dir @OUT@/hang)
  --nccl-bench "RUNS"  build/release/tests/bench/nccl_plugin_bench (a ping-pong through the
                       plugin vs tl_write_msg vs plain TCP) once per ';'-separated argument list
                       (" " for its defaults); leading NAME=VALUE words of a list go into that
                       run's environment (e.g. "TENSORLANE_TCP_BUSY_CUT=65536 --sizes none")
  --tar                everything into DIR/run.tgz (and DIR/summary.txt) at the end
  --no-rest            skip the tests not labelled gpu
  --no-gpu             skip `ctest -L gpu` and gpu_bench (host-only measurements)
  --verbs-args "ARGS"  bench-verbs.sh's arguments instead of the default
                       "--rounds 2 --iters 3000 --poll-mode 'event adaptive busy'"
  --targets LIST       build only these targets (space-separated), e.g. "tensorlane-sidecar
                       gpu_bench gpu_tests simhca_gpu_tests" with --no-rest: what `ctest -L gpu`
                       and gpu_bench need, about 60% of the build
  --gpu-filter RE      only the gpu tests matching RE (ctest -R)
  --dry-run            print the steps, change nothing
USAGE
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
debs="$root/.debs"
# prometheus-cpp's CMake package also asks for civetweb, zlib and curl (push is built in);
# perftest (and what it links) lets the verbs transport be compared with ib_write_* there too.
packages=(libtomlplusplus-dev libtomlplusplus3 libcli11-dev nlohmann-json3-dev libsodium-dev
          libsodium23 libbenchmark-dev libbenchmark1debian prometheus-cpp-dev
          libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libprometheus-cpp-push1.0
          libcivetweb-dev libcivetweb1 civetweb libcurl4-openssl-dev zlib1g-dev perftest
          libibumad3 librdmacm1 libpci3 libssl-dev)
# The soak's network tools (--soak), for a machine without them: unpacked into a prefix of
# their own and run through wrappers, so their libraries never shadow the machine's.
net_packages=(iproute2 libbpf1 libelf1 libmnl0 libcap2 libxtables12 nftables libnftables1
              libnftnl11 libjansson4 iptables libip4tc2 libip6tc2 libnetfilter-conntrack3
              libnfnetlink0 libbsd0 libmd0 libtirpc3)

if [ $# -lt 1 ]; then
    usage >&2
    exit 2
fi
cmd=$1
shift
out=${OUT:-/tmp/tensorlane-device}
jobs=$(nproc)
budget=540
min_time=0.2
filter=""
targets=""
gpu_filter=""
rest=1
gpu=1
verbs_args=(--rounds 2 --iters 3000 --poll-mode "event adaptive busy")
verbs_bench=0
simhca_bench=0
tcp_compare=0
host_latency=0
group_bench=0
vllm_bench=0
soak_args=""
gpu_repeat=1
nccl_runs=""
nccl_bench=""
tar_out=0
latency_rounds=0
dry_run=0
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out=$2; shift ;;
        --jobs) jobs=$2; shift ;;
        --budget) budget=$2; shift ;;
        --bench-min-time) min_time=$2; shift ;;
        --bench-filter) filter=$2; shift ;;
        --no-rest) rest=0 ;;
        --no-gpu) gpu=0 ;;
        --verbs-args) eval "verbs_args=($2)"; shift ;;  # shell words, quotes allowed
        --targets) targets=$2; shift ;;
        --gpu-filter) gpu_filter=$2; shift ;;
        --verbs-bench) verbs_bench=1 ;;
        --simhca-bench) simhca_bench=1 ;;
        --tcp-compare) tcp_compare=1 ;;
        --host-latency) host_latency=1 ;;
        --group-bench) group_bench=1 ;;
        --vllm-bench) vllm_bench=1 ;;
        --soak) soak_args=$2; shift ;;
        --gpu-repeat) gpu_repeat=$2; shift ;;
        --nccl) nccl_runs=$2; shift ;;
        --tar) tar_out=1 ;;
        --nccl-bench) nccl_bench=$2; shift ;;
        --latency-rounds) latency_rounds=$2; shift ;;
        --dry-run) dry_run=1 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
    shift
done

run() {
    if [ "$dry_run" -eq 1 ]; then
        printf 'would run: %s\n' "$*"
    else
        "$@"
    fi
}

case "$cmd" in
    fetch)
        run mkdir -p "$debs"
        if [ "$dry_run" -eq 0 ]; then
            (cd "$debs" && apt-get download "${packages[@]}")
            mkdir -p "$root/.debs-net"
            (cd "$root/.debs-net" && apt-get download "${net_packages[@]}")
            ls -l "$debs" "$root/.debs-net"
        else
            printf 'would run: (cd %s && apt-get download %s)\n' "$debs" "${packages[*]}"
        fi
        exit 0
        ;;
    run) ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
esac

start=$(date +%s)
left() { echo $(( budget - ($(date +%s) - start) )); }
final_out=""
if [ "$tar_out" -eq 1 ]; then
    # Everything in a folder of its own, packed into one file at the end (the run tool brings
    # back only a few files).
    final_out=$out
    out="$out/run"
fi
mkdir -p "$out"
summary="$out/summary.txt"
note() { printf '%s\n' "$*" | tee -a "$summary"; }
: >"$summary"

prefix=/tmp/tensorlane-deps
note "== device-run $(date -u +%FT%TZ) on $(hostname)"
if [ "$dry_run" -eq 0 ]; then
    shopt -s nullglob
    found=("$debs"/*.deb)
    if [ "${#found[@]}" -eq 0 ]; then
        echo "device-run: no .debs in $debs (run 'scripts/device-run.sh fetch' here first)" >&2
        exit 1
    fi
    mkdir -p "$prefix"
    for f in "${found[@]}"; do
        dpkg -x "$f" "$prefix"
    done
    # A -dev package's libX.so names the runtime of its own version (libz.so -> libz.so.1.2.13),
    # which only the host has, in its own version: point such dangling links at the host's
    # libX.so.N.
    for link in "$prefix"/usr/lib/x86_64-linux-gnu/*.so; do
        if [ -L "$link" ] && [ ! -e "$link" ]; then
            target=$(readlink "$link")
            major=$(printf '%s' "$target" | sed -E 's/^(.*\.so\.[0-9]+).*$/\1/')
            for d in /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu; do
                if [ -e "$d/$major" ]; then
                    ln -sf "$d/$major" "$link"
                    break
                fi
            done
        fi
    done
    # Their pkg-config files name /usr: point them at the prefix.
    for pc in "$prefix"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc "$prefix"/usr/share/pkgconfig/*.pc; do
        sed -i "s|^prefix=/usr\$|prefix=$prefix/usr|" "$pc"
    done
fi
export CMAKE_PREFIX_PATH="$prefix/usr"
export PKG_CONFIG_PATH="$prefix/usr/lib/x86_64-linux-gnu/pkgconfig:$prefix/usr/share/pkgconfig"
export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$prefix/usr/bin:$PATH"
# The machine's rule (KINDS.md): keep NVLink multicast off everywhere.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

{
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv || true
    nvcc --version | tail -n 2 || true
    gcc --version | head -n 1
    cmake --version | head -n 1
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' || true
    nproc
} 2>&1 | tee -a "$summary"

cd "$root"
python=$(command -v python3 || true)
note "== configure + build (release preset)"
set +e
run cmake --preset release ${python:+-DTENSORLANE_PYTHON=$python} >"$out/build.log" 2>&1
rc=$?
if [ "$rc" -eq 0 ]; then
    target_args=()
    for t in $targets; do
        target_args+=(--target "$t")
    done
    run cmake --build build/release -j "$jobs" "${target_args[@]}" >>"$out/build.log" 2>&1
    rc=$?
fi
set -e
warnings=$(grep -c 'warning:' "$out/build.log" || true)
note "build: exit $rc, $warnings warning line(s) (build.log), $(( $(date +%s) - start )) s since start"
if [ "$warnings" -gt 0 ]; then
    grep -m 20 'warning:' "$out/build.log" | tee -a "$summary"
fi
if [ "$rc" -ne 0 ]; then
    tail -n 40 "$out/build.log"
    exit "$rc"
fi

if [ "$gpu" -eq 1 ]; then
    note "== ctest -L gpu ($(left) s left)"
    set +e
    gpu_select=(-L gpu)
    if [ -n "$gpu_filter" ]; then
        gpu_select+=(-R "$gpu_filter")
    fi
    run timeout "$(left)" ctest --test-dir build/release "${gpu_select[@]}" -j 1 --timeout 180 \
        --repeat until-fail:"$gpu_repeat" --output-on-failure >"$out/ctest-gpu.log" 2>&1
    grep -E '^(100%|[0-9]+%) tests passed|tests failed|Failed|\*\*\*|Skipped|Timeout' \
        "$out/ctest-gpu.log" | tee -a "$summary"
    set -e

    note "== gpu_bench ($(left) s left)"
    bench_args=(--benchmark_min_time="$min_time" --benchmark_out="$out/gpu_bench.json"
                --benchmark_out_format=json)
    if [ -n "$filter" ]; then
        bench_args+=(--benchmark_filter="$filter")
    fi
    set +e
    run timeout "$(left)" build/release/tests/bench/gpu_bench "${bench_args[@]}" \
        >"$out/gpu_bench.txt" 2>&1
    note "gpu_bench: exit $?"
    sed -n '/== gpu_bench summary/,$p' "$out/gpu_bench.txt" | tee -a "$summary"
    set -e
fi

for ((round = 1; round <= latency_rounds; round++)); do
    [ "$(left)" -gt 30 ] || break
    set +e
    run timeout "$(left)" build/release/tests/bench/gpu_bench --benchmark_min_time="$min_time" \
        --benchmark_filter='^(LocalGpuLatency|CudaMemcpyLatency)' >"$out/latency-$round.txt" 2>&1
    set -e
    note "latency round $round: $(grep -E '^4 KiB latency' "$out/latency-$round.txt")"
done

if [ "$host_latency" -eq 1 ] && [ "$(left)" -gt 30 ]; then
    note "== host round trips: RingNop, LocalWrite/busy/4096, LocalWrite64 ($(left) s left)"
    set +e
    for b in "ring_bench ^(RingNop|LocalWrite/busy/4096)/" "metrics_bench ^LocalWrite64/"; do
        run timeout "$(left)" build/release/tests/bench/"${b%% *}" --benchmark_repetitions=3 \
            --benchmark_report_aggregates_only=true --benchmark_filter="${b#* }" \
            >>"$out/host-latency.txt" 2>&1
        note "${b%% *}: exit $?"
    done
    grep -E '_(median|mean) ' "$out/host-latency.txt" | tee -a "$summary"
    set -e
fi

if [ "$group_bench" -eq 1 ] && [ "$(left)" -gt 20 ]; then
    note "== group_bench ($(left) s left)"
    set +e
    run timeout "$(left)" build/release/tests/bench/group_bench --benchmark_repetitions=3 \
        >"$out/group_bench.txt" 2>&1
    note "group_bench: exit $?"
    grep -E '^Group' "$out/group_bench.txt" | tee -a "$summary"
    set -e
fi

if [ "$vllm_bench" -eq 1 ] && [ "$(left)" -gt 30 ]; then
    note "== vllm_kv ($(left) s left)"
    set +e
    run env PYTHONPATH=build/release/python TENSORLANE_BUILD_DIR=build/release \
        timeout "$(left)" "${python:-python3}" shim/python/bench/vllm_kv.py \
        --json "$out/vllm_kv.json" >"$out/vllm_kv.txt" 2>&1
    note "vllm_kv: exit $?"
    grep -E '^(tensorlane|torch|[0-9]+ requests)' "$out/vllm_kv.txt" | tee -a "$summary"
    set -e
fi

if [ -n "$soak_args" ] && [ "$(left)" -gt 60 ]; then
    note "== soak: scripts/soak.sh $soak_args ($(left) s left)"
    set +e
    for tool in ip nft iptables; do
        note "$tool: $(command -v "$tool" || echo missing)"
    done
    if ! command -v ip >/dev/null && [ -d "$root/.debs-net" ]; then
        netroot=/tmp/tensorlane-net
        wrap="$netroot/wrappers"  # (not bin/: the packages put ip there)
        mkdir -p "$wrap"
        for f in "$root"/.debs-net/*.deb; do
            dpkg -x "$f" "$netroot"
        done
        netlib="$netroot/usr/lib/x86_64-linux-gnu:$netroot/lib/x86_64-linux-gnu"
        for t in ip:sbin/ip nft:usr/sbin/nft iptables:usr/sbin/iptables-nft; do
            name=${t%%:*}
            path=${t#*:}
            # Where the package put it: bookworm's iproute2 has bin/ip, and sbin/ip is a link
            # to /bin/ip, which is not there on this machine (-e follows links).
            for cand in "$path" "usr/$path" "bin/$name" "usr/bin/$name"; do
                if [ -e "$netroot/$cand" ]; then
                    path=$cand
                    break
                fi
            done
            # shellcheck disable=SC2016  # (the wrapper expands them, not this script)
            printf '#!/bin/sh\nLD_LIBRARY_PATH=%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %s "$@"\n' \
                "$netlib" "$netroot/$path" >"$wrap/$name"
            chmod +x "$wrap/$name"
        done
        export PATH="$wrap:$PATH"
    fi
    soak_list=()
    eval "soak_list=($soak_args)"  # shell words, quotes allowed
    rm -rf /tmp/tensorlane-soak
    run timeout "$(left)" scripts/soak.sh --report "$out/soak-report.json" \
        --workdir /tmp/tensorlane-soak "${soak_list[@]}" >"$out/soak.txt" 2>&1
    note "soak: exit $?"
    grep -E 'INVARIANT|PASSED|FAILED|writes submitted|chaos events|stream' "$out/soak.txt" |
        tail -n 30 | tee -a "$summary"
    # The work directory (ledgers: hundreds of MiB) stays there; its workers' stderr comes back.
    tail -n 20 /tmp/tensorlane-soak/worker-w*.err >"$out/soak-workers.txt" 2>&1
    set -e
fi

if [ -n "$nccl_runs" ]; then
    # The plugin and the sidecar from this build; MPS's daemon only for the runs that ask.
    nccl_env=(LD_LIBRARY_PATH="$root/build/release/shim:$LD_LIBRARY_PATH"
              PYTHONPATH="$root/build/release/python${PYTHONPATH:+:$PYTHONPATH}"
              TENSORLANE_SIDECAR="$root/build/release/sidecar/tensorlane-sidecar")
    mps_dir=$(mktemp -d)
    mkdir -p "$mps_dir/pipe" "$mps_dir/log"
    n=0
    IFS=';' read -ra nccl_list <<<"$nccl_runs"
    for entry in "${nccl_list[@]}"; do
        entry=${entry//@OUT@/$out}  # a run's own files (--log-dir @OUT@/x) come back with it
        read -ra words <<<"$entry"
        [ "${#words[@]}" -gt 0 ] || continue
        [ "$(left)" -gt 40 ] || break
        n=$((n + 1))
        mode=${words[0]}
        note "== nccl $n: $entry ($(left) s left)"
        set +e
        if [ "$mode" = mps ]; then
            run env CUDA_MPS_PIPE_DIRECTORY="$mps_dir/pipe" CUDA_MPS_LOG_DIRECTORY="$mps_dir/log" \
                nvidia-cuda-mps-control -d
        fi
        mps_env=()
        if [ "$mode" = mps ]; then
            mps_env=(CUDA_MPS_PIPE_DIRECTORY="$mps_dir/pipe")
        fi
        run env "${nccl_env[@]}" "${mps_env[@]}" timeout "$(( $(left) - 10 ))" \
            python3 tests/nccl/torch_collectives.py "${words[@]:1}" --out "$out/nccl-$n.json" \
            >"$out/nccl-$n.txt" 2>"$out/nccl-$n.err"
        note "nccl $n ($entry): exit $?; $(tail -n 1 "$out/nccl-$n.err")"
        if [ "$mode" = mps ]; then
            echo quit | run env CUDA_MPS_PIPE_DIRECTORY="$mps_dir/pipe" nvidia-cuda-mps-control
            sleep 1
        fi
        python3 - "$out/nccl-$n.txt" <<'PY' | tee -a "$summary"
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        print(f"  {r['op']:14} {r['bytes']:>10} B {r['us']:>11.1f} us {r['algbw_GBps']:7.3f} GB/s")
PY
        set -e
    done
fi

if [ -n "$nccl_bench" ] && [ "$(left)" -gt 40 ]; then
    IFS=';' read -ra bench_list <<<"$nccl_bench"
    n=0
    for entry in "${bench_list[@]}"; do
        read -ra words <<<"$entry"
        [ "$(left)" -gt 30 ] || break
        n=$((n + 1))
        # Leading NAME=VALUE words go into this run's environment (the sidecars inherit it:
        # the experiment knobs of docs/peers.md), the rest are the bench's arguments.
        envs=()
        while [ "${#words[@]}" -gt 0 ] && [[ "${words[0]}" =~ ^[A-Z_][A-Z0-9_]*= ]]; do
            envs+=("${words[0]}")
            words=("${words[@]:1}")
        done
        note "== nccl_plugin_bench $n: ${envs[*]} ${words[*]} ($(left) s left)"
        set +e
        run timeout "$(( $(left) - 10 ))" env "${envs[@]}" \
            build/release/tests/bench/nccl_plugin_bench "${words[@]}" \
            >"$out/nccl_plugin_bench-$n.txt" 2>&1
        note "nccl_plugin_bench: exit $?"
        tee -a "$summary" <"$out/nccl_plugin_bench-$n.txt"
        set -e
    done
fi

if [ "$tcp_compare" -eq 1 ]; then
    for variant in TENSORLANE_BENCH_TAG_THREADS=0 TENSORLANE_BENCH_TCP_INTEGRITY=none; do
        [ "$(left)" -gt 60 ] || break
        note "== gpu_bench tcp rows with $variant ($(left) s left)"
        set +e
        run env "$variant" timeout "$(left)" build/release/tests/bench/gpu_bench \
            --benchmark_min_time="$min_time" --benchmark_filter='^(TcpStream|PinnedD2H|Tcp)' \
            >"$out/gpu_bench-${variant%%=*}.txt" 2>&1
        note "gpu_bench ($variant): exit $?"
        grep -E '^tcp ' "$out/gpu_bench-${variant%%=*}.txt" | tee -a "$summary"
        set -e
    done
fi

if [ "$verbs_bench" -eq 1 ] && [ "$(left)" -gt 60 ]; then
    note "== bench-verbs.sh ($(left) s left)"
    set +e
    run timeout "$(( $(left) - 20 ))" scripts/bench-verbs.sh --no-build "${verbs_args[@]}" \
        --out "$out/bench-verbs" >"$out/bench-verbs.txt" 2>&1
    note "bench-verbs: exit $?"
    tail -n 30 "$out/bench-verbs.txt" | tee -a "$summary"
    set -e
fi

if [ "$simhca_bench" -eq 1 ] && [ "$(left)" -gt 40 ]; then
    # As the simulator runs by default here, then with its polling window off (same run).
    for poll in default 0; do
        [ "$(left)" -gt 40 ] || break
        note "== simhca bench.sh, polling window $poll ($(left) s left)"
        set +e
        if [ "$poll" = default ]; then
            run timeout "$(( $(left) - 10 ))" tests/simhca/tools/bench.sh build/release \
                --iters 5000 --rounds 3 >"$out/simhca-bench-$poll.txt" 2>&1
        else
            run env TENSORLANE_SIMHCA_POLL_US="$poll" timeout "$(( $(left) - 10 ))" \
                tests/simhca/tools/bench.sh build/release --iters 5000 --rounds 3 \
                >"$out/simhca-bench-$poll.txt" 2>&1
        fi
        note "simhca bench: exit $?"
        grep -E 'ratio|rounds:|ib_write_lat:|pingpong' "$out/simhca-bench-$poll.txt" |
            tee -a "$summary"
        set -e
    done
fi

if [ "$rest" -eq 1 ] && [ "$(left)" -gt 30 ]; then
    note "== ctest, everything not labelled gpu ($(left) s left)"
    set +e
    run timeout "$(left)" ctest --test-dir build/release -LE gpu -j "$(( jobs / 2 ))" \
        --timeout 120 --output-on-failure >"$out/ctest-rest.log" 2>&1
    note "ctest (rest): exit $?"
    grep -E 'tests passed|The following tests|^\s+[0-9]+ - ' "$out/ctest-rest.log" | tail -n 40 |
        tee -a "$summary"
    set -e
fi
note "== done in $(( $(date +%s) - start )) s"
if [ -n "$final_out" ]; then
    cp "$summary" "$final_out/summary.txt"
    tar czf "$final_out/run.tgz" -C "$out" . && rm -rf "$out"
fi
