// A real etcd for the tests: Debian's etcd-server started on 127.0.0.1 with free ports and a
// temporary data directory, killed (SIGKILL, as a crash) or stopped and started again on the
// same ports and data. Tests skip, naming the package, where no etcd binary is installed.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace tensorlane::testing {

class EtcdServer {
public:
    EtcdServer() = default;
    EtcdServer(const EtcdServer &) = delete;
    EtcdServer &operator=(const EtcdServer &) = delete;
    ~EtcdServer() {
        kill();
        std::error_code ec;
        if (!dir_.empty()) {
            std::filesystem::remove_all(dir_, ec);
        }
    }

    /// $TENSORLANE_ETCD, else /usr/bin/etcd; empty when neither exists.
    static std::string binary() {
        if (const char *env = std::getenv("TENSORLANE_ETCD"); env != nullptr && *env != '\0') {
            return env;
        }
        return ::access("/usr/bin/etcd", X_OK) == 0 ? "/usr/bin/etcd" : "";
    }

    /// Serve the client port over TLS with this certificate and key; with `client_ca`, ask
    /// every client for a certificate signed by it (--client-cert-auth). Before start().
    void useTls(std::string cert, std::string key, std::string client_ca = "") {
        tls_cert_ = std::move(cert);
        tls_key_ = std::move(key);
        client_ca_ = std::move(client_ca);
    }
    /// Extra command-line flags (e.g. --auth-token-ttl=1). Before start().
    void addFlag(std::string flag) { extra_.push_back(std::move(flag)); }

    /// Starts etcd and waits until it serves; false with the reason otherwise.
    bool start(std::string *why) {
        if (binary().empty()) {
            *why = "no etcd binary (apt-get install etcd-server, or set TENSORLANE_ETCD)";
            return false;
        }
        if (dir_.empty()) {
            std::string tmpl = (std::filesystem::temp_directory_path() / "tl-etcd-XXXXXX").string();
            if (::mkdtemp(tmpl.data()) == nullptr) {
                *why = "mkdtemp failed";
                return false;
            }
            dir_ = tmpl;
            client_port_ = freePort();
            peer_port_ = freePort();
        }
        return spawn(why);
    }

    /// SIGKILL (a crash); the data directory stays for restart().
    void kill() {
        if (pid_ > 0) {
            ::kill(pid_, SIGKILL);
            int st = 0;
            ::waitpid(pid_, &st, 0);
            pid_ = -1;
        }
    }
    /// SIGSTOP / SIGCONT: etcd hangs with its sockets open.
    void pause() const { ::kill(pid_, SIGSTOP); }
    void resume() const { ::kill(pid_, SIGCONT); }

    /// Starts it again on the same ports and data.
    bool restart(std::string *why) {
        kill();
        return spawn(why);
    }

    bool running() const { return pid_ > 0; }
    uint16_t port() const { return client_port_; }
    std::string url() const {
        return (tls_cert_.empty() ? "http://127.0.0.1:" : "https://127.0.0.1:") +
               std::to_string(client_port_);
    }
    std::string logPath() const { return dir_ + ".log"; }

    /// A port nothing listens on now (bound and closed at once).
    static uint16_t freePort() {
        const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a);
        socklen_t len = sizeof a;
        ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len);
        ::close(fd);
        return ntohs(a.sin_port);
    }

private:
    bool spawn(std::string *why) {
        const std::string client = url();
        const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
        std::vector<std::string> args = {binary(),
                                         "--name=tl",
                                         "--data-dir=" + dir_ + "/data",
                                         "--listen-client-urls=" + client,
                                         "--advertise-client-urls=" + client,
                                         "--listen-peer-urls=" + peer,
                                         "--initial-advertise-peer-urls=" + peer,
                                         "--initial-cluster=tl=" + peer,
                                         "--logger=zap",
                                         "--log-level=warn"};
        if (!tls_cert_.empty()) {
            args.push_back("--cert-file=" + tls_cert_);
            args.push_back("--key-file=" + tls_key_);
        }
        if (!client_ca_.empty()) {
            args.push_back("--client-cert-auth");
            args.push_back("--trusted-ca-file=" + client_ca_);
        }
        args.insert(args.end(), extra_.begin(), extra_.end());
        const std::string log = logPath();
        pid_ = ::fork();
        if (pid_ == 0) {
            std::vector<char *> argv;
            for (auto &a : args) {
                argv.push_back(a.data());
            }
            argv.push_back(nullptr);
            FILE *f = std::freopen(log.c_str(), "a", stderr);
            (void)f;
            ::dup2(STDERR_FILENO, STDOUT_FILENO);
            ::execv(argv[0], argv.data());
            std::_Exit(127);
        }
        // Serving once a TCP connect to the client port succeeds and a request answers.
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (std::chrono::steady_clock::now() < deadline) {
            int st = 0;
            if (::waitpid(pid_, &st, WNOHANG) == pid_) {
                pid_ = -1;
                *why = "etcd exited at start; its log: " + log;
                return false;
            }
            if (answers()) {
                return true;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        *why = "etcd did not serve within 20 s; its log: " + log;
        return false;
    }

    /// A raw HTTP request to /health answered with "true" (etcd has a leader). Over TLS the
    /// client port accepting a connection is all this checks (callers retry their first call).
    bool answers() const {
        if (!tls_cert_.empty()) {
            const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
            sockaddr_in a{};
            a.sin_family = AF_INET;
            a.sin_port = htons(client_port_);
            a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            const bool ok = ::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0;
            ::close(fd);
            return ok;
        }
        const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(client_port_);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        bool ok = false;
        if (::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0) {
            const std::string req = "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
            if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) ==
                static_cast<ssize_t>(req.size())) {
                timeval tv{2, 0};
                ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
                std::string reply;
                char buf[512];
                for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) {
                    reply.append(buf, static_cast<size_t>(n));
                }
                ok = reply.find("\"health\":\"true\"") != std::string::npos;
            }
        }
        ::close(fd);
        return ok;
    }

    std::string dir_;
    uint16_t client_port_ = 0;
    uint16_t peer_port_ = 0;
    pid_t pid_ = -1;
    std::string tls_cert_, tls_key_, client_ca_;
    std::vector<std::string> extra_;
};

/// A throw-away CA, a server certificate for 127.0.0.1 and a client certificate, by openssl
/// (for etcd's TLS in the tests).
class TestPki {
public:
    TestPki() {
        dir_ = (std::filesystem::temp_directory_path() /
                ("tl-pki-" + std::to_string(::getpid()) + "-" + std::to_string(++count_)))
                   .string();
        std::filesystem::create_directories(dir_);
        std::ofstream(file("san.ext")) << "subjectAltName=IP:127.0.0.1\n";
        ok_ = run("req -x509 -newkey rsa:2048 -nodes -keyout " + file("ca.key") + " -out " +
                  file("ca.pem") + " -days 2 -subj /CN=tl-test-ca") &&
              leaf("server", "127.0.0.1", true) && leaf("client", "tl-node", false);
    }
    ~TestPki() {
        std::error_code ec;
        std::filesystem::remove_all(dir_, ec);
    }
    bool ok() const { return ok_; }
    std::string file(const std::string &name) const { return dir_ + "/" + name; }

private:
    static bool run(const std::string &args) {
        return std::system(("openssl " + args + " >/dev/null 2>&1").c_str()) == 0;
    }
    bool leaf(const std::string &name, const std::string &cn, bool san) {
        return run("req -newkey rsa:2048 -nodes -keyout " + file(name + ".key") + " -out " +
                   file(name + ".csr") + " -subj /CN=" + cn) &&
               run("x509 -req -in " + file(name + ".csr") + " -CA " + file("ca.pem") + " -CAkey " +
                   file("ca.key") + " -CAcreateserial -out " + file(name + ".pem") + " -days 2" +
                   (san ? " -extfile " + file("san.ext") : std::string()));
    }
    static inline int count_ = 0;
    std::string dir_;
    bool ok_ = false;
};

inline bool haveOpenssl() {
    return std::system("openssl version >/dev/null 2>&1") == 0;
}

/// A plain-http JSON call to etcd's gateway (the test's own, to set up users and auth).
inline std::string gatewayPost(uint16_t port, const std::string &path, const std::string &body) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string reply;
    if (::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0) {
        const std::string req = "POST " + path +
                                " HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: "
                                "application/json\r\nContent-Length: " +
                                std::to_string(body.size()) + "\r\n\r\n" + body;
        if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
            timeval tv{5, 0};
            ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            char buf[1024];
            for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) {
                reply.append(buf, static_cast<size_t>(n));
            }
        }
    }
    ::close(fd);
    return reply;
}

/// Turns etcd's user/role auth on over plain http: a root user (with the root role, as etcd
/// requires) with this password, then auth/enable. True when etcd said yes to all three.
inline bool enableRootAuth(uint16_t port, const std::string &password) {
    const auto ok = [](const std::string &reply) {
        return reply.find(" 200 ") != std::string::npos;
    };
    return ok(gatewayPost(port, "/v3/auth/user/add",
                          R"({"name":"root","password":")" + password + R"("})")) &&
           ok(gatewayPost(port, "/v3/auth/user/grant", R"({"user":"root","role":"root"})")) &&
           ok(gatewayPost(port, "/v3/auth/enable", "{}"));
}

}  // namespace tensorlane::testing
