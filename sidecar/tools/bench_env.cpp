#include "bench_env.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tensorlane/config/key_file.hpp"
#include "tensorlane/tensorlane.h"

namespace tensorlane::tools::bench {
namespace {

// Written by the signal handler and read everywhere else: lock-free atomics only (async-signal
// safety, signal-safety(7)).
std::atomic<int> g_interrupted{0};
constexpr size_t kMaxChildren = 16;
std::array<std::atomic<pid_t>, kMaxChildren> g_children{};
static_assert(std::atomic<pid_t>::is_always_lock_free && std::atomic<int>::is_always_lock_free);

void track(pid_t pid) {
    for (auto &slot : g_children) {
        pid_t empty = 0;
        if (slot.compare_exchange_strong(empty, pid)) {
            return;
        }
    }
}

void untrack(pid_t pid) {
    for (auto &slot : g_children) {
        pid_t p = pid;
        slot.compare_exchange_strong(p, 0);
    }
}

void onSignal(int) {
    g_interrupted.store(1);
    for (auto &slot : g_children) {
        if (pid_t p = slot.load(); p > 0) {
            ::kill(p, SIGTERM);
        }
    }
}

/// In a fresh child: forget the parent's children and handlers, die with the parent.
void becomeChild(pid_t parent, int deathsig) {
    for (auto &slot : g_children) {
        slot.store(0);
    }
    ::prctl(PR_SET_PDEATHSIG, deathsig);
    if (::getppid() != parent) {
        ::_exit(1);  // the parent died before prctl took effect
    }
}

int decodeStatus(int status) {
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

bool interrupted() {
    return g_interrupted.load(std::memory_order_relaxed) != 0;
}

void checkInterrupted() {
    if (interrupted()) {
        throw BenchError("interrupted");
    }
}

void installSignalHandlers() {
    struct sigaction sa {};
    sa.sa_handler = onSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // no SA_RESTART: blocking calls return EINTR and see the flag
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    ::sigaction(SIGHUP, &sa, nullptr);
    ::signal(SIGPIPE, SIG_IGN);
}

// ---- Child ----

Child::Child(pid_t pid) : pid_(pid) {
    track(pid);
}

Child &Child::operator=(Child &&o) noexcept {
    if (this != &o) {
        stop();
        pid_ = o.pid_;
        status_ = o.status_;
        o.pid_ = -1;
    }
    return *this;
}

Child Child::fork(const std::function<int()> &fn) {
    const pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) {
        throw BenchError(std::string("fork: ") + std::strerror(errno));
    }
    if (pid == 0) {
        becomeChild(parent, SIGKILL);
        int rc = 1;
        try {
            rc = fn();
        } catch (...) {
            rc = 1;
        }
        ::_exit(rc);
    }
    return Child(pid);
}

Child Child::exec(const std::vector<std::string> &argv, const std::string &log_path) {
    std::vector<char *> args;
    for (const auto &a : argv) {
        args.push_back(const_cast<char *>(a.c_str()));
    }
    args.push_back(nullptr);
    const pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) {
        throw BenchError(std::string("fork: ") + std::strerror(errno));
    }
    if (pid == 0) {
        // SIGTERM: the sidecar stops cleanly (removes its socket) when we die.
        becomeChild(parent, SIGTERM);
        struct sigaction sa {};
        sa.sa_handler = SIG_DFL;
        sigemptyset(&sa.sa_mask);
        for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) {
            ::sigaction(sig, &sa, nullptr);
        }
        int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (fd >= 0) {
            ::dup2(fd, 2);
        }
        ::execv(args[0], args.data());
        ::_exit(127);
    }
    return Child(pid);
}

bool Child::running() {
    if (pid_ <= 0) {
        return false;
    }
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
        untrack(pid_);
        status_ = decodeStatus(status);
        pid_ = -1;
        return false;
    }
    return true;
}

bool Child::waitExit(int timeout_ms) {
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (running()) {
        if (std::chrono::steady_clock::now() >= end) {
            return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
}

void Child::stop(int grace_ms) {
    if (pid_ <= 0) {
        return;
    }
    ::kill(pid_, SIGTERM);
    if (!waitExit(grace_ms) && pid_ > 0) {
        ::kill(pid_, SIGKILL);
        int status = 0;
        while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
        }
        untrack(pid_);
        status_ = decodeStatus(status);
        pid_ = -1;
    }
}

// ---- files ----

TempDir::TempDir() {
    const char *tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/tensorlane-bench.XXXXXX";
    // Sockets live here: sun_path holds 108 bytes.
    if (tmpl.size() > 60) {
        tmpl = "/tmp/tensorlane-bench.XXXXXX";
    }
    if (!::mkdtemp(tmpl.data())) {
        throw BenchError("mkdtemp " + tmpl + ": " + std::strerror(errno));
    }
    path_ = tmpl;
}

TempDir::~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
}

void writeNewFile(const std::string &path, const std::string &text, unsigned mode) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) {
        throw BenchError("cannot create " + path + ": " + std::strerror(errno));
    }
    ::fchmod(fd, mode);  // whatever the umask
    size_t off = 0;
    while (off < text.size()) {
        ssize_t n = ::write(fd, text.data() + off, text.size() - off);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            int err = errno;
            ::close(fd);
            throw BenchError("cannot write " + path + ": " + std::strerror(err));
        }
        off += static_cast<size_t>(n);
    }
    ::close(fd);
}

std::string readFile(const std::string &path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

void writeKeyFile(const std::string &path) {
    if (std::string error = config::writeNewKeyFile(path, false); !error.empty()) {
        throw BenchError("cannot write a fresh peer key: " + error);
    }
}

uint16_t freeLoopbackPort() {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        throw BenchError(std::string("socket: ") + std::strerror(errno));
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) != 0) {
        int err = errno;
        ::close(fd);
        throw BenchError(std::string("cannot find a free port: ") + std::strerror(err));
    }
    ::close(fd);
    return ntohs(a.sin_port);
}

std::string nodeToml(const NodeSettings &s) {
    std::string t;
    t += "# generated by tensorlane bench\n[node]\n";
    t += "name = \"" + s.name + "\"\n";
    t += "listen = \"127.0.0.1:" + std::to_string(s.listen_port) + "\"\n";
    t += "socket = \"" + s.socket + "\"\n";
    t += "\n[fabric]\ntransport = \"" + s.transport + "\"\n";
    if (!s.device.empty()) {
        t += "device = \"" + s.device + "\"\n";
    }
    if (s.qps_per_peer) {
        t += "qps_per_peer = " + std::to_string(s.qps_per_peer) + "\n";
    }
    t += "\n[tcp]\n";
    if (s.connections) {
        t += "connections_per_peer = " + std::to_string(s.connections) + "\n";
    }
    if (s.chunk_bytes) {
        t += "chunk_bytes = " + std::to_string(s.chunk_bytes) + "\n";
    }
    if (!s.tag_threads.empty()) {
        t += s.tag_threads == "auto" ? std::string("tag_threads = \"auto\"\n")
                                     : "tag_threads = " + s.tag_threads + "\n";
    }
    t += "\n[ipc]\nring_depth = " + std::to_string(s.ring_depth) + "\n";
    t += "poll_mode = \"" + s.poll_mode + "\"\n";
    if (s.spin_us >= 0) {
        t += "spin_us = " + std::to_string(s.spin_us) + "\n";
    }
    t += "\n[security]\npeer_key_file = \"" + s.key_file + "\"\n";
    if (!s.integrity.empty()) {
        t += "tcp_integrity = \"" + s.integrity + "\"\n";
    }
    t += "\n[[peers]]\nname = \"" + s.peer_name + "\"\n";
    t += "address = \"127.0.0.1:" + std::to_string(s.peer_port) + "\"\n";
    return t;
}

bool waitForSidecar(const std::string &socket, Child &proc, int timeout_ms) {
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < end && !interrupted()) {
        struct stat st {};
        if (::stat(socket.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
            tl_client *c = nullptr;
            if (tl_connect(socket.c_str(), &c) == TL_OK) {
                tl_disconnect(c);
                return true;
            }
        }
        if (!proc.running()) {
            return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
}

std::string selfDir() {
    std::error_code ec;
    auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) {
        return ".";
    }
    return exe.parent_path().string();
}

}  // namespace tensorlane::tools::bench
