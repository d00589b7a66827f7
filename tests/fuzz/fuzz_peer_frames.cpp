// libFuzzer target for the peer layer after authentication: a real PeerManagerImpl (with its
// tcp transport) on loopback, and this file playing the other node by hand. Each input opens a
// fresh, authenticated session in one of five phases and then sends the input's bytes as the
// rest of the control stream; the manager must never crash, whatever they hold (frames of any
// type, length and argument, torn frames, garbage).
//
// The input: byte 0 picks the phase (mod 5), the rest is sent as is.
//   0  we are the client, after READY (server side: SELECT expected)
//   1  we are the client, after SELECT/SELECTED (server side: transport open, data expected)
//   2  we are the server, right after AUTH (client side: reading the region snapshot)
//   3  we are the server, after READY and SELECT (client side: waiting for SELECTED)
//   4  we are the server, session up (SELECTED sent, the data connection authenticated)
// The sessions run with [security] tcp_integrity = "none", so the bytes reach the frame parser
// and the handlers directly (with "mac" every forged frame would stop at its tag, before them).
// The same bytes also go through the wire decoders (HELLO, CHALLENGE, REGION_ADD) directly.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sodium.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "net/frame.hpp"
#include "peer/handshake.hpp"
#include "peer/key.hpp"
#include "peer/manager.hpp"
#include "peer/wire.hpp"
#include "tensorlane/sidecar/region.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace {

using namespace tensorlane::sidecar;
namespace config = tensorlane::config;

void check(bool condition) {
    if (!condition) {
        std::abort();
    }
}

constexpr char kKeyText[] =
    "tensorlane-key-v1:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n";

class NullSink final : public EventSink {
public:
    void completed(uint64_t, Code, std::string_view) override {}
    void arrived(RegionId, uint32_t, uint64_t, uint64_t, std::string_view) override {}
    void peerState(PeerId, PeerState, std::string_view) override {}
};

/// A socket with frame I/O that drives the manager while it waits.
class Side {
public:
    Side(int fd, const std::function<void()> &pump) : fd_(fd), pump_(pump) {
        ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
        int one = 1;
        ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    ~Side() {
        if (fd_ >= 0) {
            ::close(fd_);
        }
    }
    Side(const Side &) = delete;
    Side &operator=(const Side &) = delete;

    bool sendBytes(const uint8_t *p, size_t n) {
        for (int turns = 0; n > 0 && turns < 10000; ++turns) {
            const ssize_t w = ::send(fd_, p, n, MSG_NOSIGNAL);
            if (w > 0) {
                p += w;
                n -= static_cast<size_t>(w);
            } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
                return false;
            } else {
                pump_();
            }
        }
        return n == 0;
    }
    bool sendFrame(FrameType type, uint64_t arg, std::span<const uint8_t> payload = {}) {
        uint8_t head[kFrameHeaderBytes];
        encodeFrameHeader(head, type, static_cast<uint32_t>(payload.size()), arg);
        return sendBytes(head, sizeof head) && sendBytes(payload.data(), payload.size());
    }
    /// The next frame (heartbeats skipped), or false when none came in time or the peer closed.
    bool recvFrame(FrameHeader *h, std::vector<uint8_t> *payload) {
        for (int turns = 0; turns < 20000; ++turns) {
            if (buf_.size() >= kFrameHeaderBytes) {
                if (!decodeFrameHeader(buf_.data(), h)) {
                    return false;
                }
                if (buf_.size() >= kFrameHeaderBytes + h->length) {
                    payload->assign(buf_.begin() + kFrameHeaderBytes,
                                    buf_.begin() + kFrameHeaderBytes + h->length);
                    buf_.erase(buf_.begin(), buf_.begin() + kFrameHeaderBytes + h->length);
                    if (h->type == FrameType::kHeartbeat) {
                        continue;
                    }
                    return true;
                }
            }
            uint8_t tmp[8192];
            const ssize_t r = ::recv(fd_, tmp, sizeof tmp, 0);
            if (r > 0) {
                buf_.insert(buf_.end(), tmp, tmp + r);
                continue;
            }
            if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
                return false;
            }
            pump_();
        }
        return false;
    }
    /// Sends FIN and waits (driving the manager) until the other end closes too.
    void finish() {
        ::shutdown(fd_, SHUT_WR);
        for (int turns = 0; turns < 20000; ++turns) {
            uint8_t tmp[8192];
            const ssize_t r = ::recv(fd_, tmp, sizeof tmp, 0);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                return;
            }
            if (r < 0) {
                pump_();
            }
        }
    }

private:
    int fd_;
    const std::function<void()> &pump_;
    std::vector<uint8_t> buf_;
};

struct World {
    std::string dir;
    config::Config cfg;
    RegionTable regions;
    std::vector<unsigned char> memory = std::vector<unsigned char>(1 << 16);
    TransportSet transports;  ///< before pm, which refers to it
    std::unique_ptr<PeerManagerImpl> pm;
    NullSink sink;
    PeerKey key;
    int listen_fd = -1;  ///< where the manager dials "fuzz-b"
    uint16_t listen_port = 0;
    uint64_t incarnation = 1;
    std::function<void()> pump;

    World() {
        check(sodium_init() >= 0);
        char tmpl[] = "/tmp/tl-fuzz-peer-XXXXXX";
        check(::mkdtemp(tmpl) != nullptr);
        dir = tmpl;
        const std::string key_path = dir + "/peer.key";
        const int kfd = ::open(key_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        check(kfd >= 0 && ::write(kfd, kKeyText, sizeof kKeyText - 1) ==
                              static_cast<ssize_t>(sizeof kKeyText - 1));
        ::close(kfd);
        check(PeerKey::fromFile(key_path, &key).isOk());

        listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof a;
        check(::bind(listen_fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0);
        check(::listen(listen_fd, 16) == 0);
        check(::getsockname(listen_fd, reinterpret_cast<sockaddr *>(&a), &len) == 0);
        listen_port = ntohs(a.sin_port);

        cfg.source = "<fuzz>";
        cfg.node.name = "fuzz-a";
        cfg.node.listen = config::Endpoint{"127.0.0.1", 0};
        cfg.security.peer_key_file = key_path;
        cfg.security.tcp_integrity = config::TcpIntegrity::kNone;
        cfg.tcp.connect_timeout_ms = 1000;
        cfg.tcp.peer_timeout_ms = 5000;
        cfg.tcp.keepalive_ms = 1000;
        cfg.tcp.reconnect_min_ms = 60000;
        cfg.tcp.reconnect_max_ms = 60000;
        cfg.tcp.connections_per_peer = 1;
        cfg.tcp.chunk_bytes = 64 << 10;
        cfg.tcp.tag_threads = 0;
        cfg.limits.peer_regions = 64;
        config::PeerConfig peer;
        peer.name = "fuzz-b";
        peer.address = config::Endpoint{"127.0.0.1", listen_port};
        cfg.peers.push_back(peer);

        auto r = std::make_shared<Region>();
        r->base = memory.data();
        r->bytes = memory.size();
        regions.add(r);
        check(regions.expose(r->id, "r").isOk());

        auto tcp = std::make_unique<TcpTransport>(cfg, regions);
        check(tcp->init() == 0);
        transports.add(std::move(tcp));
        pm = std::make_unique<PeerManagerImpl>(cfg, regions, key, transports);
        check(pm->init().isOk());
        check(pm->start().isOk());
        pump = [this] {
            // No sleeping: the other end of every wait is this thread (or the kernel's loopback).
            // The engine's turn: the transports, then the peer layer.
            for (Transport *t : transports.all()) {
                for (int fd : t->pollFds()) {
                    t->readable(fd);  // no poll here: look at every fd
                }
                t->progress(sink);
                t->afterPublish();
            }
            pm->readable();
            pm->progress(sink);
        };
    }

    HandshakeIdentity self() {
        HandshakeIdentity id;
        id.name = "fuzz-b";
        id.incarnation = incarnation;
        id.caps.peer_timeout_ms = cfg.tcp.peer_timeout_ms;
        id.caps.keepalive_ms = cfg.tcp.keepalive_ms;
        id.caps.integrity = 0;
        id.caps.transports = kTransportTcp;
        return id;
    }

    int dialManager() {
        const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons(pm->listenPort());
        check(::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0);
        return fd;
    }

    /// Accepts the manager's next connection to "fuzz-b" (driving it meanwhile), or -1.
    int acceptFromManager() {
        for (int turns = 0; turns < 20000; ++turns) {
            const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
            if (fd >= 0) {
                return fd;
            }
            pump();
        }
        return -1;
    }

    /// We dial the manager as "fuzz-b", authenticate, read the snapshot; `select` also picks tcp.
    void asClient(bool select, std::span<const uint8_t> bytes) {
        Side s(dialManager(), pump);
        ClientHandshake hs(key, self(), "fuzz-a", LinkRole::kControl, 0, 0);
        FrameHeader h;
        std::vector<uint8_t> p, auth;
        HandshakeOutcome o;
        if (!s.sendFrame(FrameType::kHello, 0, hs.hello()) || !s.recvFrame(&h, &p) ||
            h.type != FrameType::kChallenge) {
            return;
        }
        // An honest manager's challenge always verifies for an honest client: say why not.
        if (Status st = hs.onChallenge(p, &auth, &o); !st.isOk()) {
            std::fprintf(stderr,
                         "fuzz_peer_frames: the manager's CHALLENGE (%zu bytes) failed: %s\n",
                         p.size(), st.message().c_str());
            std::abort();
        }
        if (!s.sendFrame(FrameType::kAuth, 0, auth)) {
            return;
        }
        do {
            if (!s.recvFrame(&h, &p)) {
                return;
            }
        } while (h.type != FrameType::kReady);
        if (select) {
            if (!s.sendFrame(FrameType::kSelect, kTransportTcp,
                             encodeTcpBlob(cfg.tcp.connections_per_peer, cfg.tcp.chunk_bytes)) ||
                !s.recvFrame(&h, &p) || h.type != FrameType::kSelected) {
                return;
            }
        }
        (void)s.sendBytes(bytes.data(), bytes.size());
        s.finish();
    }

    /// Answers one handshake from the manager on `s`; false when it did not complete.
    bool serverHandshake(Side &s, LinkRole role) {
        FrameHeader h;
        std::vector<uint8_t> p, challenge;
        if (!s.recvFrame(&h, &p) || h.type != FrameType::kHello) {
            return false;
        }
        ServerHandshake hs(key, self());
        if (!hs.onHello(
                   p, [](const HelloMsg &) { return Status::ok(); }, 0x5e55, &challenge)
                 .isOk() ||
            !s.sendFrame(FrameType::kChallenge, 0, challenge) || !s.recvFrame(&h, &p) ||
            h.type != FrameType::kAuth) {
            return false;
        }
        HandshakeOutcome o;
        return hs.onAuth(p, &o).isOk() && o.role == role;
    }

    /// The manager dials us ("fuzz-b"); we answer as far as `phase` (2, 3 or 4), then send.
    void asServer(int phase, std::span<const uint8_t> bytes) {
        const PeerId peer = *pm->peerByName("fuzz-b");
        pm->lookup(peer, "x", [](Status, RemoteRegion) {});
        const int fd = acceptFromManager();
        if (fd >= 0) {
            Side s(fd, pump);
            serveSession(s, phase, bytes);
        }
        // No reconnect: the next input starts afresh.
        pm->disconnect(peer);
        for (int i = 0; i < 4; ++i) {
            pump();
        }
        // Drain connections it began meanwhile.
        for (int extra; (extra = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC)) >= 0;) {
            ::close(extra);
        }
    }

    void serveSession(Side &s, int phase, std::span<const uint8_t> bytes) {
        if (!serverHandshake(s, LinkRole::kControl)) {
            return;
        }
        std::unique_ptr<Side> data;
        if (phase >= 3) {
            const auto add = encodeRegionAdd(4096, "x");
            FrameHeader h;
            std::vector<uint8_t> p;
            if (!s.sendFrame(FrameType::kRegionAdd, 1, add) || !s.sendFrame(FrameType::kReady, 0) ||
                !s.recvFrame(&h, &p) || h.type != FrameType::kSelect) {
                return;
            }
            if (phase == 4) {
                if (!s.sendFrame(
                        FrameType::kSelected, h.arg,
                        encodeTcpBlob(cfg.tcp.connections_per_peer, cfg.tcp.chunk_bytes))) {
                    return;
                }
                const int dfd = acceptFromManager();
                if (dfd < 0) {
                    return;
                }
                data = std::make_unique<Side>(dfd, pump);
                if (!serverHandshake(*data, LinkRole::kData) ||
                    !data->sendFrame(FrameType::kReady, 0)) {
                    return;
                }
                for (int i = 0; i < 8; ++i) {
                    pump();
                }
            }
        }
        (void)s.sendBytes(bytes.data(), bytes.size());
        s.finish();
    }
};

World &world() {
    static World *w = new World();  // never destroyed: libFuzzer exits without unwinding
    return *w;
}

/// The decoders alone, on the same bytes.
void decodeDirectly(std::span<const uint8_t> bytes) {
    HelloMsg hello;
    ChallengeMsg challenge;
    RegionDescriptor d;
    std::string error;
    if (decodeHello(bytes, &hello, &error)) {
        check(hello.from.size() <= kMaxNodeNameBytes && hello.to.size() <= kMaxNodeNameBytes);
    }
    (void)decodeChallenge(bytes, &challenge, &error);
    if (decodeRegionAdd(7, bytes, &d)) {
        check(d.id == 7 && d.name.size() <= kMaxRegionNameBytes);
    }
    (void)peekVersion(bytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) {
        return 0;
    }
    World &w = world();
    const std::span<const uint8_t> bytes(data + 1, size - 1);
    decodeDirectly(bytes);
    ++w.incarnation;
    switch (data[0] % 5) {
        case 0:
            w.asClient(false, bytes);
            break;
        case 1:
            w.asClient(true, bytes);
            break;
        default:
            w.asServer(data[0] % 5, bytes);
            break;
    }
    // Whatever happened, the manager still answers, with a status that parses.
    check(nlohmann::json::parse(w.pm->statusJson(), nullptr, false).is_object());
    return 0;
}
