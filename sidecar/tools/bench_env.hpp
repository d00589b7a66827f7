// `tensorlane bench`: the processes and files a run makes, and how they are cleaned up — a temp
// dir with generated configs and a fresh key, sidecar processes, forked workers, and the
// SIGINT/SIGTERM handling that ends them all.
#pragma once

#include <sys/types.h>

#include <csignal>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace tensorlane::tools::bench {

/// Any failure of the benchmark itself; the message is printed as it is.
class BenchError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// Set by SIGINT/SIGTERM/SIGHUP; long waits check it.
bool interrupted();
/// Throws BenchError("interrupted") once a signal came.
void checkInterrupted();
/// Installs the handlers: they set the flag and send SIGTERM to every tracked child, so no
/// blocking call waits on a process that is already gone.
void installSignalHandlers();

/// A child process, ended (SIGTERM, then SIGKILL after `grace_ms`) and reaped at destruction.
class Child {
public:
    Child() = default;
    ~Child() { stop(); }
    Child(Child &&o) noexcept : pid_(o.pid_) { o.pid_ = -1; }
    Child &operator=(Child &&o) noexcept;
    Child(const Child &) = delete;
    Child &operator=(const Child &) = delete;

    /// Forks; the child runs `fn` and exits with its result. The child dies with us
    /// (PR_SET_PDEATHSIG) and stops tracking our children.
    static Child fork(const std::function<int()> &fn);
    /// Forks and execs `argv[0]` with stderr appended to `log_path`.
    static Child exec(const std::vector<std::string> &argv, const std::string &log_path);

    pid_t pid() const { return pid_; }
    /// True while the process has not exited (reaps it when it has; see exitStatus()).
    bool running();
    /// The exit status once reaped (128 + signal when killed), -1 before.
    int exitStatus() const { return status_; }
    /// Waits up to `timeout_ms` for it to exit on its own. True when it did.
    bool waitExit(int timeout_ms);
    /// SIGTERM, up to `grace_ms` to exit, then SIGKILL; always reaps.
    void stop(int grace_ms = 2000);

private:
    explicit Child(pid_t pid);
    pid_t pid_ = -1;
    int status_ = -1;
};

/// A fresh 0700 directory under $TMPDIR or /tmp, removed with its contents at destruction.
class TempDir {
public:
    TempDir();
    ~TempDir();
    TempDir(const TempDir &) = delete;
    TempDir &operator=(const TempDir &) = delete;
    const std::string &path() const { return path_; }
    std::string file(const std::string &name) const { return path_ + "/" + name; }

private:
    std::string path_;
};

/// Writes a new file with exactly `mode` (O_EXCL: never reuses one that exists).
void writeNewFile(const std::string &path, const std::string &text, unsigned mode);
/// Reads a whole file ("" when it cannot).
std::string readFile(const std::string &path);
/// A fresh peer key file (tensorlane-key-v1, mode 0600; `tensorlane keygen` writes the same).
void writeKeyFile(const std::string &path);
/// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then closed).
uint16_t freeLoopbackPort();

/// What the generated node configs may set.
struct NodeSettings {
    std::string name;
    uint16_t listen_port = 0;
    std::string socket;
    std::string key_file;
    std::string peer_name;
    uint16_t peer_port = 0;
    uint32_t connections = 0;  ///< [tcp] connections_per_peer; 0 keeps the default
    uint64_t chunk_bytes = 0;  ///< [tcp] chunk_bytes; 0 keeps the default
    std::string poll_mode = "auto";
    int spin_us = -1;  ///< [ipc] spin_us; negative keeps the default
    uint32_t ring_depth = 1024;
    std::string integrity;          ///< [security] tcp_integrity; empty keeps the default (mac)
    std::string tag_threads;        ///< [tcp] tag_threads ("auto" or 0-16); empty: the default
    std::string transport = "tcp";  ///< [fabric] transport: "tcp" or "verbs"
    std::string device;             ///< verbs: [fabric] device (e.g. "sim0"); empty: auto
    uint32_t qps_per_peer = 0;      ///< verbs: [fabric] qps_per_peer; 0 keeps the default
};
/// The TOML of one loopback node that lists the other as its only peer.
std::string nodeToml(const NodeSettings &s);

/// Polls the sidecar's socket until a client can connect (true) or the process exits or
/// `timeout_ms` passes (false).
bool waitForSidecar(const std::string &socket, Child &proc, int timeout_ms);

/// The directory of the running executable (from /proc/self/exe).
std::string selfDir();

}  // namespace tensorlane::tools::bench
