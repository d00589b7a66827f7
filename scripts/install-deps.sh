#!/usr/bin/env bash
# Installs the Debian packages tensorlane builds and tests with. Idempotent and quick when all
# are present: apt-get runs only for what is missing. apt-get's output goes to a log file; the
# terminal gets one line before and one after (and the log's tail and path if it fails).
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/install-deps.sh [--dry-run]

Installs (with apt-get, as root or through sudo) the build and test dependencies that are
missing: compilers, CMake/Ninja, rdma-core, Boost, toml++, spdlog, CLI11, nlohmann-json,
libsodium, prometheus-cpp (the metrics endpoint), GoogleTest, Google Benchmark, clang
(fuzzing), clang-format, shellcheck, iproute2, gnuplot (the bench's chart);
for the Python package's tests: pytest, numpy, PyTorch (CPU), pip and mypy (Debian's
python3-*); for the simulated HCA's tests: zlib, perftest, tcpdump, tshark, nftables,
iptables, libnetfilter-queue; for the deployment tests: PyYAML and systemd-analyze; for the
metrics tests: Prometheus (the server and promtool; on a host run by systemd, Debian's package
also starts prometheus.service on port 9090, which the tests do not need: the script says so);
libcurl (the etcd directory's HTTP client) and etcd-server (the directory tests start their own
etcd on loopback; Debian's package may also start etcd.service on port 2379, unused by them),
openssl (the certificates of the directory's TLS tests).
  --dry-run   print what would be installed, change nothing
USAGE
}

dry_run=0
for arg in "$@"; do
    case "$arg" in
        --dry-run) dry_run=1 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "install-deps: unknown argument '$arg'" >&2; usage >&2; exit 2 ;;
    esac
done

packages=(
    build-essential g++ cmake ninja-build pkg-config git
    libibverbs-dev rdma-core ibverbs-utils
    libboost-dev libtomlplusplus-dev libspdlog-dev libcli11-dev nlohmann-json3-dev libsodium-dev
    libssl-dev prometheus-cpp-dev
    libgtest-dev libgmock-dev libbenchmark-dev
    clang libclang-rt-14-dev clang-format shellcheck
    iproute2 procps python3
    python3-pytest python3-numpy python3-torch python3-pip mypy
    zlib1g-dev perftest tcpdump tshark nftables iptables libnetfilter-queue-dev
    python3-yaml systemd
    prometheus gnuplot-nox
    libcurl4-openssl-dev etcd-server openssl
)

is_installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

missing=()
for p in "${packages[@]}"; do
    is_installed "$p" || missing+=("$p")
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "install-deps: all ${#packages[@]} packages present"
    exit 0
fi
if [ "$dry_run" -eq 1 ]; then
    echo "install-deps: would install ${#missing[@]} of ${#packages[@]} packages with apt-get:" \
        "${missing[*]}"
    exit 0
fi

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
    sudo_cmd=(sudo)
    # Ask for a password now, on the terminal, not behind the redirection below.
    sudo -v
fi
installed_count() {
    dpkg-query -W -f='${db:Status-Abbrev}\n' 2>/dev/null | grep -c '^ii' || true
}

log=$(mktemp "${TMPDIR:-/tmp}/tensorlane-install-deps.XXXXXX.log")
echo "install-deps: installing ${#missing[@]} of ${#packages[@]} Debian packages with apt-get:" \
    "${missing[*]} (log: $log)"
before=$(installed_count)
start=$SECONDS
apt=("${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q -y -o Dpkg::Use-Pty=0)
if ! { "${apt[@]}" update && "${apt[@]}" install --no-install-recommends "${missing[@]}"; } \
    >"$log" 2>&1; then
    echo "install-deps: apt-get failed; the end of its log:" >&2
    tail -n 20 "$log" >&2
    echo "install-deps: the whole log is $log" >&2
    exit 1
fi
still=()
for p in "${missing[@]}"; do
    is_installed "$p" || still+=("$p")
done
if [ "${#still[@]}" -gt 0 ]; then
    echo "install-deps: apt-get did not install: ${still[*]}; its log is $log" >&2
    exit 1
fi
extra=$(($(installed_count) - before - ${#missing[@]}))
summary="${#missing[@]} package"
[ "${#missing[@]}" -eq 1 ] || summary+=s
[ "$extra" -le 0 ] || summary+=" and $extra they depend on"
echo "install-deps: installed $summary in $((SECONDS - start)) s"
rm -f "$log"
for p in "${missing[@]}"; do
    if [ "$p" = prometheus ] && command -v systemctl >/dev/null 2>&1 &&
        systemctl is-active --quiet prometheus 2>/dev/null; then
        echo "install-deps: note: Debian's prometheus package started prometheus.service" \
            "(port 9090); the tests start their own server on loopback. To stop it:" \
            "systemctl disable --now prometheus"
    fi
done
