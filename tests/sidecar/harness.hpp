// Test harness: a real tensorlane-sidecar process with a generated config, and forked client
// processes. Integration tests use only this, the shim's C ABI, and raw ipc for hostile clients.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../simhca/loader_path.hpp"
#include "free_port.hpp"
#include "tensorlane/tensorlane.h"

namespace tltest {

/// A fresh directory under /tmp, removed with its files at destruction.
class TempDir {
public:
    TempDir() {
        char tmpl[] = "/tmp/tensorlane-test-XXXXXX";
        path_ = ::mkdtemp(tmpl);
        ::chmod(path_.c_str(), 0755);
    }
    ~TempDir() {
        std::string cmd = "rm -rf '" + path_ + "'";
        [[maybe_unused]] int rc = std::system(cmd.c_str());
    }
    const std::string &path() const { return path_; }
    std::string file(const std::string &name) const { return path_ + "/" + name; }

private:
    std::string path_;
};

/// A peer key file's content (tensorlane-key-v1, what `tensorlane keygen` writes): the prefix
/// and 64 copies of `digit` (a hex digit), so each digit names a different key.
/// Fast failure detection for tests of peers that fail ([fabric.tcp] keys): the bound under
/// test is peer_timeout_ms, kPeerTimeoutMs.
constexpr int kPeerTimeoutMs = 1500;
inline const std::string kFastFailureTcp =
    "keepalive_ms = 200\npeer_timeout_ms = 1500\nconnect_timeout_ms = 1000\n"
    "reconnect_min_ms = 50\nreconnect_max_ms = 400\n";

/// Drops to `uid`/`gid` with exactly `groups` as supplementary groups (in a forked child).
inline bool becomeUser(uid_t uid, gid_t gid, const std::vector<gid_t> &groups = {}) {
    return ::setgroups(groups.size(), groups.data()) == 0 && ::setgid(gid) == 0 &&
           ::setuid(uid) == 0;
}

inline std::string keyText(char digit) {
    return "tensorlane-key-v1:" + std::string(64, digit) + "\n";
}

inline void writeFile(const std::string &path, const std::string &text, mode_t mode = 0644) {
    std::ofstream(path) << text;
    ::chmod(path.c_str(), mode);
}

/// Counts entries in a directory (/proc/PID/fd, /dev/shm), -1 if unreadable.
inline int countEntries(const std::string &dir, const std::string &prefix = "") {
    DIR *d = ::opendir(dir.c_str());
    if (!d) {
        return -1;
    }
    int n = 0;
    while (dirent *e = ::readdir(d)) {
        std::string name = e->d_name;
        if (name == "." || name == "..") {
            continue;
        }
        if (prefix.empty() || name.rfind(prefix, 0) == 0) {
            ++n;
        }
    }
    ::closedir(d);
    return n;
}

/// Lines in /proc/PID/maps that map shared memory (/dev/shm or SYSV-style shm files).
inline int countShmMappings(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/maps");
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
        if (line.find("/dev/shm/") != std::string::npos ||
            line.find("tensorlane-") != std::string::npos) {
            ++n;
        }
    }
    return n;
}

/// Polls `cond` every 10 ms until it holds or `timeout` passes.
inline bool eventually(const std::function<bool()> &cond,
                       std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
        if (cond()) {
            return true;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return cond();
}

/// A TCP port on 127.0.0.1 that was free a moment ago.

struct PeerEntry {
    std::string name;
    std::string address;  ///< host:port
};

struct SidecarOptions {
    std::string name = "node-a";
    std::string poll_mode = "adaptive";
    uint32_t ring_depth = 256;
    std::string listen = "127.0.0.1:18515";
    std::vector<PeerEntry> peers;
    std::string key_file;        ///< empty: a fresh key in the sidecar's directory
    std::string netns;           ///< run inside this network namespace (ip netns exec)
    std::string tcp;             ///< body of a [tcp] table
    std::string extra_security;  ///< extra lines for [security]
    std::string extra;           ///< extra TOML appended at the end
    /// "tcp" (the default), "verbs" or "auto": a verbs or auto node runs on the simulated HCA, with
    /// a sysfs tree of its own (one device, `rdma_ip` as its RoCE v2 GID) in its directory.
    std::string transport = "tcp";
    std::string rdma_ip;      ///< verbs: the IPv4 address of the simulated port
    std::string rdma_netdev;  ///< verbs: its netdev's name (default "tlsim0")
    /// verbs: the netdev MTU the tree says (the port's active MTU follows it); it must not
    /// exceed the real interface's (loopback: 65536; a veth: 1500).
    int rdma_mtu = 4200;
    /// verbs: the simulated NIC's PCI function ("0000:03:00.0"), linked from its class entries
    /// as on a real host (mksysfs.sh --pci); empty: on no bus.
    std::string rdma_pci;
    std::string fabric;  ///< extra lines for [fabric]
};

/// A loopback address no other test process uses at the same time, for simulated RDMA ports:
/// 127.<pid-derived>.<pid-derived>.<n>.
inline std::string uniqueLoopback(int n) {
    const unsigned pid = static_cast<unsigned>(::getpid());
    return "127." + std::to_string(1 + (pid >> 8) % 250) + "." + std::to_string(pid % 250) + "." +
           std::to_string(n);
}

/// Writes a sysfs tree for one simulated RoCE device (tests/simhca/tools/mksysfs.sh).
inline bool makeSimTree(const std::string &root, const std::string &netdev, const std::string &ip,
                        int mtu = 4200, const std::string &more = "") {
    const std::string cmd = std::string("bash '") + TENSORLANE_MKSYSFS + "' '" + root +
                            "' --dev sim0 --netdev " + netdev + " --ip " + ip + " --mtu " +
                            std::to_string(mtu) + " " + more + " >/dev/null";
    return std::system(cmd.c_str()) == 0;
}

/// One tensorlane-sidecar process, started in the constructor and stopped in the destructor.
class Sidecar {
public:
    explicit Sidecar(SidecarOptions opts = {}) : opts_(std::move(opts)) {
        socket_ = dir_.file("sidecar.sock");
        key_ = opts_.key_file;
        if (key_.empty()) {
            key_ = dir_.file("peer.key");
            writeFile(key_, keyText('0'), 0600);
        }
        if (opts_.transport != "tcp") {
            if (opts_.rdma_netdev.empty()) {
                opts_.rdma_netdev = "tlsim0";
            }
            sysfs_ = dir_.file("sys");
            // No address: a host with no RDMA device at all (an empty tree).
            tree_ok_ = opts_.rdma_ip.empty()
                           ? ::mkdir(sysfs_.c_str(), 0755) == 0
                           : makeSimTree(sysfs_, opts_.rdma_netdev, opts_.rdma_ip, opts_.rdma_mtu,
                                         opts_.rdma_pci.empty() ? "" : "--pci " + opts_.rdma_pci);
        }
        config_ = dir_.file("sidecar.toml");
        writeFile(config_, toml());
        start();
    }
    ~Sidecar() { kill(SIGTERM); }
    Sidecar(const Sidecar &) = delete;
    Sidecar &operator=(const Sidecar &) = delete;

    std::string toml() const {
        std::string t = "[node]\nname = \"" + opts_.name + "\"\nlisten = \"" + opts_.listen +
                        "\"\nsocket = \"" + socket_ +
                        "\"\n[ipc]\nring_depth = " + std::to_string(opts_.ring_depth) +
                        "\npoll_mode = \"" + opts_.poll_mode +
                        "\"\n[security]\npeer_key_file = \"" + key_ + "\"\n" +
                        opts_.extra_security + "\n";
        if (!opts_.tcp.empty()) {
            t += "[tcp]\n" + opts_.tcp + "\n";
        }
        t += "[fabric]\ntransport = \"" + opts_.transport + "\"\n";
        if (opts_.transport != "tcp") {
            t += "netdev = \"" + opts_.rdma_netdev + "\"\n";
        }
        t += opts_.fabric + "\n";
        for (const auto &p : opts_.peers) {
            t += "[[peers]]\nname = \"" + p.name + "\"\naddress = \"" + p.address + "\"\n";
        }
        return t + opts_.extra + "\n";
    }

    void start() {
        pid_ = ::fork();
        if (pid_ == 0) {
            std::string log = dir_.file("sidecar.log");
            int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
            ::dup2(fd, 2);
            if (opts_.transport != "tcp") {
                // The production binary, unchanged, on the simulated HCA: the library swapped
                // through the loader path, the devices read from the node's own tree.
                ::setenv("LD_LIBRARY_PATH", simhcaLoaderPath(TENSORLANE_SIMHCA_DIR).c_str(), 1);
                ::setenv("TENSORLANE_SYSFS_ROOT", sysfs_.c_str(), 1);
            }
            if (!opts_.netns.empty()) {
                ::execlp("ip", "ip", "netns", "exec", opts_.netns.c_str(), TENSORLANE_SIDECAR_BIN,
                         "--config", config_.c_str(), "--log-level", "debug",
                         static_cast<char *>(nullptr));
            } else {
                ::execl(TENSORLANE_SIDECAR_BIN, "tensorlane-sidecar", "--config", config_.c_str(),
                        "--log-level", "debug", static_cast<char *>(nullptr));
            }
            ::_exit(127);
        }
        bool died = false;
        ready_ = eventually([&] {
            tl_client *c = nullptr;
            if (tl_connect(socket_.c_str(), &c) == TL_OK) {
                tl_disconnect(c);
                return true;
            }
            int status;
            died = ::waitpid(pid_, &status, WNOHANG) == pid_;
            return died;  // died: give up
        });
        if (died) {
            ready_ = false;
            pid_ = -1;  // reaped: never signal a pid that may be reused
        }
    }

    /// Sends `sig` and reaps the process.
    void kill(int sig) {
        if (pid_ > 0) {
            ::kill(pid_, sig);
            int status;
            ::waitpid(pid_, &status, 0);
            pid_ = -1;
        }
    }
    bool alive() const { return pid_ > 0 && ::kill(pid_, 0) == 0; }
    /// verbs nodes: the simulated device's sysfs tree (empty for tcp nodes).
    const std::string &sysfsRoot() const { return sysfs_; }
    bool treeOk() const { return opts_.transport != "verbs" || tree_ok_; }
    bool ready() const { return ready_; }
    pid_t pid() const { return pid_; }
    const std::string &socket() const { return socket_; }
    const std::string &configPath() const { return config_; }
    const std::string &dir() const { return dir_.path(); }
    std::string log() const {
        std::ifstream in(dir_.file("sidecar.log"));
        return std::string(std::istreambuf_iterator<char>(in), {});
    }
    /// Whether the log shows `text` within `timeout` (the sidecar logs asynchronously, so a
    /// line can follow the event it describes by a moment).
    bool logHas(const std::string &text,
                std::chrono::milliseconds timeout = std::chrono::seconds(5)) const {
        return eventually([&] { return log().find(text) != std::string::npos; }, timeout);
    }
    int openFds() const { return countEntries("/proc/" + std::to_string(pid_) + "/fd"); }
    int shmMappings() const { return countShmMappings(pid_); }

private:
    SidecarOptions opts_;
    TempDir dir_;
    std::string socket_;
    std::string key_;
    std::string config_;
    std::string sysfs_;
    bool tree_ok_ = false;
    pid_t pid_ = -1;
    bool ready_ = false;
};

/// Runs `fn` in a forked child; its return value is the child's exit status.
inline pid_t forkClient(const std::function<int()> &fn) {
    pid_t pid = ::fork();
    if (pid == 0) {
        int rc = 99;
        try {
            rc = fn();
        } catch (...) {
            rc = 98;
        }
        ::_exit(rc);
    }
    return pid;
}

/// Waits for a child; its exit status, or 128 + signal.
inline int waitChild(pid_t pid) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/// Bytes that are never all zero: a deterministic pattern from a seed.
inline void fillRandom(void *p, size_t n, uint64_t seed) {
    std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + 1);
    auto *b = static_cast<unsigned char *>(p);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = rng() | 1;  // never a zero word
        std::memcpy(b + i, &v, 8);
    }
    for (; i < n; ++i) {
        b[i] = static_cast<unsigned char>(rng() | 1);
    }
}

/// Retries tl_lookup until the name appears (another process exposes it) or time runs out.
inline tl_status lookupEventually(tl_client *c, const char *peer, const char *name, tl_remote *out,
                                  uint64_t *bytes,
                                  std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    auto end = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        tl_status s = tl_lookup(c, peer, name, out, bytes);
        if (s != TL_ENOENT || std::chrono::steady_clock::now() > end) {
            return s;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
}

/// How many clients the sidecar serves now, from its status (counts "session" keys).
inline int clientCount(tl_client *c) {
    std::string buf(1 << 16, '\0');
    size_t len = 0;
    if (tl_sidecar_status(c, buf.data(), buf.size(), &len) != TL_OK) {
        return -1;
    }
    int n = 0;
    for (size_t pos = 0; (pos = buf.find("\"session\"", pos)) != std::string::npos; ++pos) {
        ++n;
    }
    return n;
}

}  // namespace tltest
