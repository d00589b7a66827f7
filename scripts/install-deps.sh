#!/usr/bin/env bash
# Installs the Debian packages tensorlane builds and tests with. Idempotent and quick when all
# are present: apt-get runs only for what is missing.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/install-deps.sh [--dry-run]

Installs (with apt-get) the build and test dependencies that are missing:
compilers, CMake/Ninja, rdma-core, Boost, toml++, spdlog, CLI11, nlohmann-json, libsodium,
GoogleTest, Google Benchmark, clang (fuzzing), clang-format, shellcheck, iproute2; for the
Python package's tests: pytest, numpy, PyTorch (CPU), pip and mypy (Debian's python3-*);
for the simulated HCA's tests: zlib, perftest, tcpdump, tshark, nftables, iptables,
libnetfilter-queue.
  --dry-run   print what would be installed, change nothing
USAGE
}

dry_run=0
for arg in "$@"; do
    case "$arg" in
        --dry-run) dry_run=1 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done

packages=(
    build-essential g++ cmake ninja-build pkg-config git
    libibverbs-dev rdma-core ibverbs-utils
    libboost-dev libtomlplusplus-dev libspdlog-dev libcli11-dev nlohmann-json3-dev libsodium-dev
    libgtest-dev libgmock-dev libbenchmark-dev
    clang libclang-rt-14-dev clang-format shellcheck
    iproute2 procps python3
    python3-pytest python3-numpy python3-torch python3-pip mypy
    zlib1g-dev perftest tcpdump tshark nftables iptables libnetfilter-queue-dev
)

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "install-deps: all ${#packages[@]} packages present"
    exit 0
fi

echo "install-deps: missing: ${missing[*]}"
if [ "$dry_run" -eq 1 ]; then
    exit 0
fi
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
    sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
