// Support for the benchmarks: a real tensorlane-sidecar process with a generated config in a
// temp dir, CPU time from /proc, and percentiles. Benchmarks use only this and the shim's C ABI.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tensorlane/tensorlane.h"

namespace tlbench {

/// A fresh directory under /tmp, removed with its files at destruction.
class TempDir {
public:
    TempDir() {
        char tmpl[] = "/tmp/tensorlane-bench-XXXXXX";
        if (!::mkdtemp(tmpl)) {
            throw std::runtime_error("mkdtemp failed");
        }
        path_ = tmpl;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    TempDir(const TempDir &) = delete;
    TempDir &operator=(const TempDir &) = delete;
    const std::string &path() const { return path_; }
    std::string file(const std::string &name) const { return path_ + "/" + name; }

private:
    std::string path_;
};

/// Writes `text` to a new file created with `mode` (never wider, whatever the umask).
inline void writeFile(const std::string &path, const std::string &text, mode_t mode = 0644) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (fd < 0) {
        throw std::runtime_error("cannot create " + path);
    }
    ::fchmod(fd, mode);
    size_t off = 0;
    while (off < text.size()) {
        ssize_t n = ::write(fd, text.data() + off, text.size() - off);
        if (n <= 0) {
            ::close(fd);
            throw std::runtime_error("cannot write " + path);
        }
        off += static_cast<size_t>(n);
    }
    ::close(fd);
}

/// utime + stime of a process (all its threads), in seconds; -1 when it cannot be read.
inline double cpuSeconds(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(in)), {});
    // The command name (field 2) may hold spaces; fields after its closing ')' are fixed.
    auto close = text.rfind(')');
    if (close == std::string::npos) {
        return -1;
    }
    std::istringstream rest(text.substr(close + 2));
    std::string field;
    unsigned long long utime = 0, stime = 0;
    // Fields 3.. : state(3) ... utime(14) stime(15).
    for (int i = 3; i <= 15 && rest >> field; ++i) {
        if (i == 14) {
            utime = std::stoull(field);
        } else if (i == 15) {
            stime = std::stoull(field);
        }
    }
    return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

/// CPU time of every thread of a process from /proc/PID/task/*/schedstat (nanosecond
/// resolution, where /proc/PID/stat counts clock ticks), in seconds; -1 when unreadable.
inline double schedSeconds(pid_t pid) {
    std::error_code ec;
    double total = 0;
    bool any = false;
    for (const auto &task :
         std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
        std::ifstream in(task.path() / "schedstat");
        unsigned long long run_ns = 0;
        if (in >> run_ns) {
            total += static_cast<double>(run_ns) / 1e9;
            any = true;
        }
    }
    return any ? total : -1;
}

/// A port nobody listens on now (bind to 0, read it back).
inline int freePort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = 0;
    if (::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) == 0) {
        port = ntohs(a.sin_port);
    }
    ::close(fd);
    return port;
}

/// The value at quantile q (0..1) of `v` (sorted in place).
/// fork() for helper processes that must never outlive the benchmark: the child gets SIGKILL
/// when the parent dies (and exits at once if it already has). Returns what fork() returns.
inline pid_t forkTied() {
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != parent) {
            ::_exit(1);
        }
    }
    return pid;
}

inline double percentile(std::vector<double> &v, double q) {
    if (v.empty()) {
        return 0;
    }
    std::sort(v.begin(), v.end());
    size_t i = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
    return v[std::min(i, v.size() - 1)];
}

struct SidecarOptions {
    std::string name = "node-a";
    std::string poll_mode = "adaptive";  ///< busy | adaptive | event
    uint32_t ring_depth = 1024;
    std::string log_level = "warn";
    std::string listen = "127.0.0.1:18515";
    std::string extra;                     ///< TOML appended to the generated config
    std::vector<std::string> environment;  ///< NAME=VALUE set for the sidecar
    std::string binary;  ///< the tensorlane-sidecar to run; empty: the one built with the bench
};

/// One tensorlane-sidecar process with a generated single-node config (no [[peers]]), started
/// in the constructor and stopped (SIGTERM, then reaped) in the destructor.
class Sidecar {
public:
    explicit Sidecar(SidecarOptions opts = {}) : opts_(std::move(opts)) {
        socket_ = dir_.file("sidecar.sock");
        key_ = dir_.file("peer.key");
        writeFile(key_, "tensorlane-key-v1:" + std::string(64, '0') + "\n", 0600);
        config_ = dir_.file("sidecar.toml");
        writeFile(config_, toml());
        start();
    }
    ~Sidecar() { stop(); }
    Sidecar(const Sidecar &) = delete;
    Sidecar &operator=(const Sidecar &) = delete;

    std::string toml() const {
        return "[node]\nname = \"" + opts_.name + "\"\nlisten = \"" + opts_.listen +
               "\"\nsocket = \"" + socket_ +
               "\"\n[ipc]\nring_depth = " + std::to_string(opts_.ring_depth) + "\npoll_mode = \"" +
               opts_.poll_mode + "\"\n[security]\npeer_key_file = \"" + key_ + "\"\n" + opts_.extra;
    }

    void stop() {
        if (pid_ > 0) {
            ::kill(pid_, SIGTERM);
            int status = 0;
            ::waitpid(pid_, &status, 0);
            pid_ = -1;
        }
    }
    pid_t pid() const { return pid_; }
    const std::string &socket() const { return socket_; }
    const SidecarOptions &options() const { return opts_; }
    std::string log() const {
        std::ifstream in(dir_.file("sidecar.log"));
        return std::string(std::istreambuf_iterator<char>(in), {});
    }

private:
    void start() {
        const pid_t parent = ::getpid();
        pid_ = ::fork();
        if (pid_ < 0) {
            throw std::runtime_error("fork failed");
        }
        if (pid_ == 0) {
            // Never outlive the benchmark, whatever kills it.
            ::prctl(PR_SET_PDEATHSIG, SIGTERM);
            if (::getppid() != parent) {
                ::_exit(1);
            }
            std::string log = dir_.file("sidecar.log");
            int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
            ::dup2(fd, 2);
            for (const std::string &kv : opts_.environment) {
                ::putenv(const_cast<char *>(kv.c_str()));
            }
            const char *bin = opts_.binary.empty() ? TENSORLANE_SIDECAR_BIN : opts_.binary.c_str();
            ::execl(bin, "tensorlane-sidecar", "--config", config_.c_str(), "--log-level",
                    opts_.log_level.c_str(), static_cast<char *>(nullptr));
            ::_exit(127);
        }
        auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (std::chrono::steady_clock::now() < end) {
            tl_client *c = nullptr;
            if (tl_connect(socket_.c_str(), &c) == TL_OK) {
                tl_disconnect(c);
                return;
            }
            int status = 0;
            if (::waitpid(pid_, &status, WNOHANG) == pid_) {
                pid_ = -1;
                break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        std::string why = log();
        stop();
        throw std::runtime_error("tensorlane-sidecar did not start: " + why);
    }

    SidecarOptions opts_;
    TempDir dir_;
    std::string socket_;
    std::string key_;
    std::string config_;
    pid_t pid_ = -1;
};

}  // namespace tlbench
