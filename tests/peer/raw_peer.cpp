#include "raw_peer.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "peer/wire.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace tensorlane::peertest {

using namespace sidecar;

RawConn::~RawConn() {
    if (fd_ >= 0) {
        ::close(fd_);
    }
}

RawConn::RawConn(RawConn &&o) noexcept
    : fd_(std::exchange(o.fd_, -1)), tx_(std::move(o.tx_)), rx_(std::move(o.rx_)) {}

RawConn &RawConn::operator=(RawConn &&o) noexcept {
    if (this != &o) {
        if (fd_ >= 0) {
            ::close(fd_);
        }
        fd_ = std::exchange(o.fd_, -1);
        tx_ = std::move(o.tx_);
        rx_ = std::move(o.rx_);
    }
    return *this;
}

RawConn RawConn::connect(uint16_t port, const std::string &host, const std::string &source) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (!source.empty()) {
        sockaddr_in local{};
        local.sin_family = AF_INET;
        ::inet_pton(AF_INET, source.c_str(), &local.sin_addr);
        if (::bind(fd, reinterpret_cast<sockaddr *>(&local), sizeof local) != 0) {
            ::close(fd);
            return RawConn();
        }
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    ::inet_pton(AF_INET, host.c_str(), &a.sin_addr);
    if (::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
        ::close(fd);
        return RawConn();
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return RawConn(fd);
}

void RawConn::authenticate(const HandshakeOutcome &o, bool client) {
    if (o.integrity) {
        tx_ = FrameAuth(client ? o.c2s_key : o.s2c_key);
        rx_ = FrameAuth(client ? o.s2c_key : o.c2s_key);
    }
}

bool RawConn::writeAll(const void *p, size_t n) {
    const auto *b = static_cast<const uint8_t *>(p);
    while (n > 0) {
        ssize_t w = ::send(fd_, b, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            return false;
        }
        b += w;
        n -= static_cast<size_t>(w);
    }
    return true;
}

bool RawConn::readAll(void *p, size_t n, int timeout_ms) {
    auto *b = static_cast<uint8_t *>(p);
    while (n > 0) {
        pollfd pf{fd_, POLLIN, 0};
        if (::poll(&pf, 1, timeout_ms) <= 0) {
            return false;
        }
        ssize_t r = ::recv(fd_, b, n, 0);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r <= 0) {
            return false;
        }
        b += r;
        n -= static_cast<size_t>(r);
    }
    return true;
}

bool RawConn::send(FrameType type, uint64_t arg, std::span<const uint8_t> payload) {
    std::vector<uint8_t> buf(kFrameHeaderBytes + payload.size());
    encodeFrameHeader(buf.data(), type, static_cast<uint32_t>(payload.size()), arg);
    std::copy(payload.begin(), payload.end(), buf.begin() + kFrameHeaderBytes);
    if (tx_.enabled()) {
        uint8_t tag[kFrameTagBytes];
        tx_.sign(buf.data(), buf.size(), nullptr, 0, tag);
        buf.insert(buf.end(), tag, tag + kFrameTagBytes);
    }
    return writeAll(buf.data(), buf.size());
}

bool RawConn::sendChunk(uint64_t seq, const ChunkHeader &h, const uint8_t *data, uint32_t len,
                        bool corrupt_tag) {
    return sendChunk(seq, h, data, len, corrupt_tag ? Tamper::kForged : Tamper::kNone);
}

bool RawConn::sendChunk(uint64_t seq, const ChunkHeader &h, const uint8_t *data, uint32_t len,
                        Tamper tamper) {
    uint8_t head[kChunkFrameOverhead];
    encodeChunkFrame(head, seq, h, len);
    uint8_t trailer[kChunkTrailerBytes];
    if (tx_.enabled()) {
        tx_.signChunk(head, sizeof head, data, len, trailer);
        if (tamper == Tamper::kForged) {
            trailer[3] ^= 0x10;
            trailer[kFrameTagBytes + 3] ^= 0x10;
        }
    }
    std::vector<uint8_t> sent(data, data + len);
    if (tamper == Tamper::kDataChanged && len > 0) {
        sent[len / 2] ^= 0x01;  // after it was tagged
    }
    if (!writeAll(head, sizeof head) || !writeAll(sent.data(), len)) {
        return false;
    }
    return !tx_.enabled() || writeAll(trailer, sizeof trailer);
}

bool RawConn::recv(FrameHeader *h, std::vector<uint8_t> *payload, int timeout_ms) {
    uint8_t head[kFrameHeaderBytes];
    if (!readAll(head, sizeof head, timeout_ms) || !decodeFrameHeader(head, h)) {
        return false;
    }
    payload->resize(h->length);
    if (h->length > 0 && !readAll(payload->data(), h->length, timeout_ms)) {
        return false;
    }
    if (rx_.enabled()) {
        uint8_t tag[kFrameTagBytes];
        if (!readAll(tag, sizeof tag, timeout_ms)) {
            return false;
        }
        rx_.begin();
        rx_.update(head, sizeof head);
        rx_.update(payload->data(), payload->size());
        if (!rx_.verify(tag)) {
            return false;
        }
    }
    return true;
}

bool RawConn::recvType(FrameType type, FrameHeader *h, std::vector<uint8_t> *payload,
                       int timeout_ms) {
    for (;;) {
        if (!recv(h, payload, timeout_ms)) {
            return false;
        }
        if (h->type == type) {
            return true;
        }
        if (h->type != FrameType::kHeartbeat) {
            return false;
        }
    }
}

bool RawConn::closedWithin(int timeout_ms) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    char buf[65536];
    while (std::chrono::steady_clock::now() < end) {
        pollfd pf{fd_, POLLIN, 0};
        if (::poll(&pf, 1, 20) > 0) {
            ssize_t r = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                return true;
            }
        }
    }
    return false;
}

HandshakeIdentity rawIdentity(const std::string &name, const RawCaps &caps) {
    HandshakeIdentity id;
    id.name = name;
    id.incarnation = 0x7a11ull;
    id.caps.peer_timeout_ms = caps.peer_timeout_ms;
    id.caps.keepalive_ms = caps.keepalive_ms;
    id.caps.integrity = caps.integrity ? 1 : 0;
    id.caps.transports = caps.transports;
    return id;
}

namespace {

PeerKey keyFrom(const std::string &secret) {
    PeerKey k;
    (void)PeerKey::fromText(secret, &k);
    return k;
}

}  // namespace

// ----- client

RawClientPeer::RawClientPeer(const std::string &secret, std::string name, std::string server_name,
                             uint16_t port, RawCaps caps)
    : key_(keyFrom(secret)),
      name_(std::move(name)),
      server_name_(std::move(server_name)),
      port_(port),
      caps_(caps) {
    data_.resize(caps_.connections);
}

bool RawClientPeer::openSession(std::string *why) {
    std::vector<uint8_t> selected;
    return openSession(kTransportTcp, encodeTcpBlob(caps_.connections, caps_.chunk_bytes),
                       &selected, why);
}

bool RawClientPeer::openSession(uint32_t transport, std::span<const uint8_t> blob,
                                std::vector<uint8_t> *selected, std::string *why) {
    control_ = RawConn::connect(port_, "127.0.0.1", source_);
    if (!control_.ok()) {
        *why = "connect failed";
        return false;
    }
    ClientHandshake hs(key_, rawIdentity(name_, caps_), server_name_, LinkRole::kControl, 0, 0);
    FrameHeader h;
    std::vector<uint8_t> p;
    if (!control_.send(FrameType::kHello, 0, hs.hello()) || !control_.recv(&h, &p) ||
        h.type != FrameType::kChallenge) {
        *why = h.type == FrameType::kRefuse ? "refused: " + std::string(p.begin(), p.end())
                                            : std::string("no CHALLENGE");
        return false;
    }
    std::vector<uint8_t> auth;
    HandshakeOutcome o;
    if (Status s = hs.onChallenge(p, &auth, &o); !s.isOk()) {
        *why = s.message();
        return false;
    }
    if (!control_.send(FrameType::kAuth, 0, auth)) {
        *why = "cannot send AUTH";
        return false;
    }
    control_.authenticate(o, true);
    session_id_ = o.session_id;
    server_incarnation_ = o.peer_incarnation;
    for (;;) {
        if (!control_.recv(&h, &p)) {
            *why = "no snapshot";
            return false;
        }
        if (h.type == FrameType::kRegionAdd) {
            RegionDescriptor d;
            if (decodeRegionAdd(h.arg, p, &d)) {
                regions_.push_back(d);
            }
        } else if (h.type == FrameType::kReady) {
            break;
        }
    }
    if (!control_.send(FrameType::kSelect, transport, blob) ||
        !control_.recvType(FrameType::kSelected, &h, selected)) {
        *why = "no SELECTED";
        return false;
    }
    return true;
}

bool RawClientPeer::openData(uint32_t index, std::string *why) {
    RawConn c = RawConn::connect(port_, "127.0.0.1", source_);
    ClientHandshake hs(key_, rawIdentity(name_, caps_), server_name_, LinkRole::kData, session_id_,
                       index);
    FrameHeader h;
    std::vector<uint8_t> p;
    if (!c.ok() || !c.send(FrameType::kHello, 0, hs.hello()) ||
        !c.recvType(FrameType::kChallenge, &h, &p)) {
        *why = "data connection: no CHALLENGE";
        return false;
    }
    std::vector<uint8_t> auth;
    HandshakeOutcome o;
    if (Status s = hs.onChallenge(p, &auth, &o); !s.isOk()) {
        *why = s.message();
        return false;
    }
    if (!c.send(FrameType::kAuth, 0, auth)) {
        *why = "cannot send AUTH";
        return false;
    }
    c.authenticate(o, true);
    if (!c.recvType(FrameType::kReady, &h, &p)) {
        *why = "data connection: no READY";
        return false;
    }
    data_.at(index) = std::move(c);
    return true;
}

// ----- server

int listenOnLoopback(uint16_t *port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a);
    ::listen(fd, 16);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len);
    *port = ntohs(a.sin_port);
    return fd;
}

RawServerPeer::RawServerPeer(const std::string &secret, std::string name, RawCaps caps)
    : key_(keyFrom(secret)), name_(std::move(name)), caps_(caps) {
    listen_fd_ = listenOnLoopback(&port_);
    data_.resize(caps_.connections);
}

RawServerPeer::~RawServerPeer() {
    if (listen_fd_ >= 0) {
        ::close(listen_fd_);
    }
}

bool RawServerPeer::acceptOne(RawConn *out, HandshakeOutcome *o, std::string *why) {
    pollfd pf{listen_fd_, POLLIN, 0};
    if (::poll(&pf, 1, 5000) <= 0) {
        *why = "nobody connected";
        return false;
    }
    RawConn c(::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC));
    ServerHandshake hs(key_, rawIdentity(name_, caps_));
    FrameHeader h;
    std::vector<uint8_t> p, challenge;
    if (!c.recvType(FrameType::kHello, &h, &p)) {
        *why = "no HELLO";
        return false;
    }
    Status s = hs.onHello(
        p, [](const HelloMsg &) { return Status::ok(); }, session_id_, &challenge);
    if (!s.isOk() || !c.send(FrameType::kChallenge, 0, challenge) ||
        !c.recvType(FrameType::kAuth, &h, &p)) {
        *why = "handshake: " + s.message();
        return false;
    }
    if (Status a = hs.onAuth(p, o); !a.isOk()) {
        *why = a.message();
        return false;
    }
    c.authenticate(*o, false);
    *out = std::move(c);
    return true;
}

bool RawServerPeer::acceptSession(const RegionDescriptor &region, std::string *why) {
    HandshakeOutcome o;
    if (!acceptOne(&control_, &o, why)) {
        return false;
    }
    FrameHeader h;
    std::vector<uint8_t> p;
    if (!control_.send(FrameType::kRegionAdd, region.id,
                       encodeRegionAdd(region.bytes, region.name)) ||
        !control_.send(FrameType::kReady, 0) || !control_.recvType(FrameType::kSelect, &h, &p) ||
        !control_.send(FrameType::kSelected, h.arg,
                       encodeTcpBlob(caps_.connections, caps_.chunk_bytes))) {
        *why = "no SELECT";
        return false;
    }
    return true;
}

bool RawServerPeer::acceptData(std::string *why) {
    for (uint32_t i = 0; i < caps_.connections; ++i) {
        RawConn c;
        HandshakeOutcome o;
        if (!acceptOne(&c, &o, why) || !c.send(FrameType::kReady, 0)) {
            return false;
        }
        data_.at(o.data_index) = std::move(c);
    }
    return true;
}

}  // namespace tensorlane::peertest
