#!/usr/bin/env bash
# The test command: installs what is missing, checks formatting and scripts, builds, runs the
# five fuzzers briefly (config, peer frames, verbs, control, simulated HCA packets), the ring
# stress tests, peer managers and simulated HCA under ThreadSanitizer, the simulated HCA under
# ASan+UBSan, then every CTest tier that runs on this machine (the Python package's pytest files
# are CTest entries named python.*). Each step prints the minutes since the start; the run ends
# with CTest's summary line.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/test.sh [--quick] [--python] [--no-install]

  --quick        skip the ThreadSanitizer and fuzz builds
  --python       only the Python package: build what it needs, run its pytest files
  --no-install   do not run scripts/install-deps.sh
Environment: FUZZ_SECONDS (default 12, per fuzzer), JOBS (default: nproc).
USAGE
}

quick=0
python_only=0
install=1
for arg in "$@"; do
    case "$arg" in
        --quick) quick=1 ;;
        --python) python_only=1 ;;
        --no-install) install=0 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
jobs=${JOBS:-$(nproc)}
fuzz_seconds=${FUZZ_SECONDS:-12}

step() { printf '\n== [%dm%02ds] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }

if [ "$install" -eq 1 ]; then
    step "dependencies"
    scripts/install-deps.sh
fi

if [ "$python_only" -eq 1 ]; then
    step "Python package: build what the tests need, run tests/python through CTest"
    cmake --preset release -DTENSORLANE_WERROR=ON >/dev/null
    cmake --build build/release --target tensorlane-sidecar tensorlane-python -j "$jobs"
    ctest --test-dir build/release -R '^python\.' -j "$jobs" --output-on-failure
    exit 0
fi

step "clang-format"
mapfile -t sources < <(git ls-files '*.cpp' '*.hpp' '*.h' '*.cc' '*.cu')
if [ "${#sources[@]}" -gt 0 ]; then
    clang-format --dry-run -Werror "${sources[@]}"
fi
echo "clang-format: ${#sources[@]} files clean"

step "shellcheck"
mapfile -t scripts < <(git ls-files 'scripts/*.sh' '.ci/run' 'tests/scripts/*.sh' \
    'tests/scripts/fakebin/*' 'tests/bench/*.sh')
shellcheck "${scripts[@]}"
echo "shellcheck: ${#scripts[@]} scripts clean"

step "folder dependencies"
scripts/check-layers.sh

if [ "$quick" -eq 0 ]; then
    # Five libFuzzer targets (docs/SECURITY.md, "Fuzzing"), each from its checked-in corpus into
    # a scratch one: the config parser, peer frames after authentication (a real peer manager),
    # the verbs receiver's descriptors and control payloads, a client's control messages against
    # a real engine (its finding fixed: docs/SECURITY.md), and the simulated HCA's packet parser.
    step "libFuzzer: config, peer frames, verbs, control, simhca packets (${fuzz_seconds}s each)"
    cmake --preset fuzz >/dev/null
    cmake --build build/fuzz --target fuzz_config fuzz_control fuzz_peer_frames fuzz_verbs \
        fuzz_simhca_packet -j "$jobs"
    run_fuzzer() {  # NAME CORPUS MAX_LEN TIMEOUT BINARY: output in build/fuzz/NAME.log
        mkdir -p "build/fuzz/corpus-$1"
        "$5" -max_total_time="$fuzz_seconds" -max_len="$3" -timeout="$4" -print_final_stats=1 \
            "build/fuzz/corpus-$1" "$2" >"build/fuzz/$1.log" 2>&1
    }
    # Two at a time (CI has two cores); libFuzzer exits non-zero on a crash.
    fuzz_pair() {  # "ARGS..." "ARGS..."
        local -a names=() pids=()
        for spec in "$@"; do
            # shellcheck disable=SC2086
            set -- $spec
            run_fuzzer "$@" &
            pids+=("$!")
            names+=("$1")
        done
        local failed=0
        for i in "${!pids[@]}"; do
            local rc=0
            wait "${pids[$i]}" || rc=$?
            echo "-- ${names[$i]}"
            tail -n 6 "build/fuzz/${names[$i]}.log"
            if [ "$rc" -ne 0 ]; then
                echo "fuzzer ${names[$i]} failed (exit $rc, build/fuzz/${names[$i]}.log)" >&2
                failed=1
            fi
        done
        [ "$failed" -eq 0 ] || exit 1
    }
    fuzz_pair "config tests/fuzz/corpus/config 4096 10 build/fuzz/tests/fuzz/fuzz_config" \
        "peer-frames tests/fuzz/corpus/peer_frames 8192 10 build/fuzz/tests/fuzz/fuzz_peer_frames"
    fuzz_pair "verbs tests/fuzz/corpus/verbs 2048 10 build/fuzz/tests/fuzz/fuzz_verbs" \
        "control tests/fuzz/corpus/control 2048 10 build/fuzz/tests/fuzz/fuzz_control"
    fuzz_pair "simhca-packet tests/simhca/fuzz/corpus/packet 9000 10 \
build/fuzz/tests/simhca/fuzz/fuzz_simhca_packet"

    step "ThreadSanitizer: ring stress, frame tags on worker threads, tcp peers"
    cmake --preset tsan >/dev/null
    cmake --build build/tsan --target ipc_stress tag_pool_tests copy_pool_tests peer_tests -j "$jobs"
    ctest --test-dir build/tsan -L stress -LE '^simhca$' --output-on-failure
    TSAN_OPTIONS="halt_on_error=1 exitcode=66" build/tsan/tests/peer/tag_pool_tests
    # The NCCL plugin's copy helpers (callers from several threads, helpers joining late).
    TSAN_OPTIONS="halt_on_error=1 exitcode=66" build/tsan/tests/nccl/copy_pool_tests
    # The peer managers over tcp, hostile peers and tampering included (the verbs cases run on
    # the simulated HCA, instrumented below).
    if ! TSAN_OPTIONS="halt_on_error=1 exitcode=66" build/tsan/tests/peer/peer_tests \
        --gtest_filter='-*verbs*:*Verbs*:Registrar*:FlushOff*' --gtest_brief=1 \
        >build/tsan/peer_tests.log 2>&1; then
        tail -n 80 build/tsan/peer_tests.log
        echo "peer_tests under ThreadSanitizer failed (build/tsan/peer_tests.log)" >&2
        exit 1
    fi
    tail -n 2 build/tsan/peer_tests.log

    # The simulated HCA and its tests, instrumented: the conformance suite and the netns fault
    # tests (their traffic programs are built with the same sanitizer).
    simhca_targets=(simhca_ibverbs simhca_conformance simhca_exchange simhca_fault_tests
        simhca_unit_tests)
    step "ASan+UBSan: simulated HCA"
    cmake --preset asan >/dev/null
    cmake --build build/asan --target "${simhca_targets[@]}" -j "$jobs"
    ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build/asan -L '^simhca$' -E '^(Programs|SimEnv)\.|_NOT_BUILT$|^hw_check_script$' \
        -j "$jobs" --output-on-failure
    step "ThreadSanitizer: simulated HCA"
    cmake --build build/tsan --target "${simhca_targets[@]}" -j "$jobs"
    TSAN_OPTIONS="halt_on_error=1 exitcode=66" ctest --test-dir build/tsan -L '^simhca$' \
        -E '^(Programs|SimEnv)\.|_NOT_BUILT$|^hw_check_script$' -j "$jobs" --output-on-failure
fi

step "build (release preset, -Wall -Wextra -Werror)"
# The release preset itself never fails on a warning (a newer compiler's warning in a dependency
# must not stop a user's build); CI and the dev presets keep -Werror.
cmake --preset release -DTENSORLANE_WERROR=ON >/dev/null
cmake --build build/release -j "$jobs"

step "tests"
ctest --preset release -j "$jobs" --timeout 300
