// The bootstrap port under attack and misconfiguration: wrong keys, unknown names, mismatched
// settings, garbage, slow and half-open connections, floods, replayed handshakes.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sodium.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "harness.hpp"
#include "net/frame.hpp"
#include "peer/handshake.hpp"
#include "peer/key.hpp"
#include "raw_peer.hpp"

namespace tensorlane::peertest {
namespace {

using Clock = std::chrono::steady_clock;

const std::string kOtherSecret = keyText('8');

/// A blocking client socket to `host`:port, from `source` when given (any 127/8 address is a
/// local source on loopback: a stand-in for another host), or -1.
int rawConnect(uint16_t port, const char *host = "127.0.0.1", const char *source = nullptr) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (source != nullptr) {
        sockaddr_in local{};
        local.sin_family = AF_INET;
        ::inet_pton(AF_INET, source, &local.sin_addr);
        if (::bind(fd, reinterpret_cast<sockaddr *>(&local), sizeof local) != 0) {
            ::close(fd);
            return -1;
        }
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    ::inet_pton(AF_INET, host, &a.sin_addr);
    a.sin_port = htons(port);
    if (::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
        ::close(fd);
        return -1;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/// Waits until the server closes `fd` (EOF or reset); returns how long it took, or nullopt.
std::optional<std::chrono::milliseconds> waitClosed(int fd, std::chrono::milliseconds timeout) {
    const auto t0 = Clock::now();
    char buf[4096];
    while (Clock::now() - t0 < timeout) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 20) > 0) {
            ssize_t r = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
            }
        }
    }
    return std::nullopt;
}

bool sendAll(int fd, const void *p, size_t n) {
    const auto *b = static_cast<const uint8_t *>(p);
    while (n > 0) {
        ssize_t w = ::send(fd, b, n, MSG_NOSIGNAL);
        if (w <= 0) {
            return false;
        }
        b += w;
        n -= static_cast<size_t>(w);
    }
    return true;
}

std::vector<uint8_t> frame(sidecar::FrameType type, const std::vector<uint8_t> &payload) {
    std::vector<uint8_t> out(sidecar::kFrameHeaderBytes + payload.size());
    sidecar::encodeFrameHeader(out.data(), type, static_cast<uint32_t>(payload.size()), 0);
    std::copy(payload.begin(), payload.end(), out.begin() + sidecar::kFrameHeaderBytes);
    return out;
}

/// Reads one frame with a timeout.
bool readFrame(int fd, sidecar::FrameHeader *h, std::vector<uint8_t> *payload,
               std::chrono::milliseconds timeout) {
    std::vector<uint8_t> buf;
    const auto t0 = Clock::now();
    auto need = [&](size_t n) {
        while (buf.size() < n) {
            if (Clock::now() - t0 > timeout) {
                return false;
            }
            pollfd p{fd, POLLIN, 0};
            if (::poll(&p, 1, 20) <= 0) {
                continue;
            }
            uint8_t tmp[4096];
            ssize_t r = ::recv(fd, tmp, std::min(sizeof tmp, n - buf.size()), 0);
            if (r <= 0) {
                return false;
            }
            buf.insert(buf.end(), tmp, tmp + r);
        }
        return true;
    };
    if (!need(sidecar::kFrameHeaderBytes) || !sidecar::decodeFrameHeader(buf.data(), h)) {
        return false;
    }
    if (!need(sidecar::kFrameHeaderBytes + h->length)) {
        return false;
    }
    payload->assign(buf.begin() + sidecar::kFrameHeaderBytes, buf.end());
    return true;
}

nlohmann::json listenerStatus(Node &n) {
    return nlohmann::json::parse(n.statusJson())["listener"];
}

bool waitUntil(const std::function<bool()> &pred, std::chrono::milliseconds timeout) {
    const auto until = Clock::now() + timeout;
    while (!pred()) {
        if (Clock::now() >= until) {
            return false;
        }
        std::this_thread::sleep_for(5ms);
    }
    return true;
}

/// Keeps `n` silent connections from `source` open to 127.0.0.1:port: each one the node closes
/// is opened again at once, as a flood that does not give up would.
class Flooder {
public:
    Flooder(uint16_t port, const char *source, int n)
        : thread_([this, port, source, n] { run(port, source, n); }) {}
    ~Flooder() {
        stop_.store(true);
        thread_.join();
    }
    int opened() const { return opened_.load(); }

private:
    void run(uint16_t port, const char *source, int n) {
        std::vector<int> fds;
        while (!stop_.load()) {
            while (static_cast<int>(fds.size()) < n && !stop_.load()) {
                const int fd = rawConnect(port, "127.0.0.1", source);
                if (fd < 0) {
                    break;
                }
                fds.push_back(fd);
                opened_.fetch_add(1);
            }
            for (auto it = fds.begin(); it != fds.end();) {
                pollfd p{*it, POLLIN, 0};
                char c;
                ssize_t r = 1;
                if (::poll(&p, 1, 0) > 0) {
                    r = ::recv(*it, &c, 1, MSG_DONTWAIT);
                }
                if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                    ::close(*it);
                    it = fds.erase(it);
                } else {
                    ++it;
                }
            }
            std::this_thread::sleep_for(2ms);
        }
        for (int fd : fds) {
            ::close(fd);
        }
    }
    std::atomic<bool> stop_{false};
    std::atomic<int> opened_{0};
    std::thread thread_;
};

class PeerSecurity : public ::testing::Test {
protected:
    std::unique_ptr<Node> makeNode(const std::string &name, uint16_t port,
                                   const std::string &key_file,
                                   std::vector<std::pair<std::string, uint16_t>> peers,
                                   std::function<void(config::Config &)> tweak = {}) {
        NodeOptions o;
        o.name = name;
        o.port = port;
        o.key_file = key_file;
        o.peers = std::move(peers);
        o.tweak = std::move(tweak);
        auto n = std::make_unique<Node>(o);
        EXPECT_TRUE(n->ok()) << n->startStatus().message();
        return n;
    }
    /// A node listening on `host` (a 127/8 address), its peers at `peer_hosts`.
    std::unique_ptr<Node> makeNodeAt(const std::string &name, const std::string &host,
                                     uint16_t port, const std::string &key_file,
                                     std::vector<std::pair<std::string, uint16_t>> peers,
                                     std::vector<std::string> peer_hosts,
                                     std::function<void(config::Config &)> tweak = {}) {
        NodeOptions o;
        o.name = name;
        o.port = port;
        o.listen_host = host;
        o.key_file = key_file;
        o.peers = std::move(peers);
        o.peer_hosts = std::move(peer_hosts);
        o.tweak = std::move(tweak);
        auto n = std::make_unique<Node>(o);
        EXPECT_TRUE(n->ok()) << n->startStatus().message();
        return n;
    }
    TempDir dir_;
};

TEST_F(PeerSecurity, WrongKeyIsRefusedBothWays) {
    const auto k1 = dir_.writeFile("k1", kSecret);
    const auto k2 = dir_.writeFile("k2", kOtherSecret);
    const uint16_t pa = freePort(), pb = freePort();
    auto a = makeNode("node-a", pa, k1, {{"node-b", pb}});
    auto b = makeNode("node-b", pb, k2, {{"node-a", pa}});
    b->addRegion(4096, "r");
    a->addRegion(4096, "r");

    auto [s, rr] = a->lookup("node-b", "r");
    EXPECT_EQ(s.code(), Code::kPeer);
    EXPECT_NE(s.message().find("authentication failed"), std::string::npos) << s.message();
    // The accepting side logged and counted it, with the connecting address.
    ASSERT_TRUE(b->sink.waitFor([&](auto &) { return listenerStatus(*b)["rejected"] >= 1; }, 3s));
    const std::string why = listenerStatus(*b)["last_rejection"];
    EXPECT_NE(why.find("127.0.0.1"), std::string::npos) << why;
    EXPECT_NE(why.find("authentication failed"), std::string::npos) << why;
    EXPECT_TRUE(peerLogHas({"node-b", "authentication failed"}));

    auto [s2, rr2] = b->lookup("node-a", "r");
    EXPECT_EQ(s2.code(), Code::kPeer);
    EXPECT_NE(s2.message().find("authentication failed"), std::string::npos) << s2.message();
    auto st = nlohmann::json::parse(b->statusJson())["peers"][0];
    EXPECT_EQ(st["state"], "failed");
    EXPECT_NE(st["last_error"].get<std::string>().find("authentication failed"), std::string::npos);
}

TEST_F(PeerSecurity, UnknownPeerNameIsRefused) {
    const auto k = dir_.writeFile("k", kSecret);
    const uint16_t pb = freePort(), px = freePort();
    auto b = makeNode("node-b", pb, k, {{"node-a", freePort()}});
    auto x = makeNode("node-x", px, k, {{"node-b", pb}});
    b->addRegion(4096, "r");
    auto [s, rr] = x->lookup("node-b", "r");
    EXPECT_EQ(s.code(), Code::kPeer);
    EXPECT_NE(s.message().find("unknown peer 'node-x'"), std::string::npos) << s.message();
    EXPECT_TRUE(peerLogHas({"127.0.0.1", "unknown peer 'node-x'"}));
}

TEST_F(PeerSecurity, SettingMismatchIsRefusedNamingBothValues) {
    const auto k = dir_.writeFile("k", kSecret);
    const uint16_t pa = freePort(), pb = freePort();
    auto a = makeNode("node-a", pa, k, {{"node-b", pb}},
                      [](config::Config &c) { c.tcp.chunk_bytes = 1u << 20; });
    auto b = makeNode("node-b", pb, k, {{"node-a", pa}},
                      [](config::Config &c) { c.tcp.chunk_bytes = 256u << 10; });
    b->addRegion(4096, "r");
    auto [s, rr] = a->lookup("node-b", "r");
    EXPECT_EQ(s.code(), Code::kPeer);
    EXPECT_NE(s.message().find("chunk_bytes"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("1048576"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("262144"), std::string::npos) << s.message();
    // The other end saw the same reason.
    EXPECT_TRUE(peerLogHas({"262144", "1048576", "127.0.0.1"}));
}

TEST_F(PeerSecurity, GarbageSlowAndHalfOpenConnectionsAreDroppedWhileAGoodPeerWorks) {
    const auto k = dir_.writeFile("k", kSecret);
    const uint16_t pa = freePort(), pb = freePort();
    auto a = makeNode("node-a", pa, k, {{"node-b", pb}});
    auto b = makeNode("node-b", pb, k, {{"node-a", pa}});
    auto dst = b->addRegion(1 << 20, "recv");
    auto src = a->addRegion(1 << 20);
    fillRandom(src->base, 1 << 20, 21);

    // Garbage: random bytes.
    int garbage = rawConnect(pb);
    ASSERT_GE(garbage, 0);
    std::vector<uint8_t> junk(4096);
    std::mt19937_64 rng(5);
    for (auto &j : junk) {
        j = static_cast<uint8_t>(rng());
    }
    sendAll(garbage, junk.data(), junk.size());
    // A frame that claims to be huge: refused by its header, never buffered.
    int huge = rawConnect(pb);
    uint8_t head[sidecar::kFrameHeaderBytes];
    sidecar::encodeFrameHeader(head, sidecar::FrameType::kHello, 1u << 30, 0);
    sendAll(huge, head, sizeof head);
    // Half-open: connects, says nothing.
    int silent = rawConnect(pb);
    // Slowloris: a valid-looking HELLO, one byte every 150 ms.
    int slow = rawConnect(pb);
    ASSERT_TRUE(garbage >= 0 && huge >= 0 && silent >= 0 && slow >= 0);
    std::atomic<bool> stop_slow{false};
    std::thread dribbler([&] {
        sidecar::PeerKey key;
        (void)sidecar::PeerKey::fromText(kSecret, &key);
        sidecar::HandshakeIdentity id{"node-a", 1, {1500, 250}};
        sidecar::ClientHandshake hs(key, id, "node-b", sidecar::LinkRole::kControl, 0, 0);
        auto bytes = frame(sidecar::FrameType::kHello, hs.hello());
        for (size_t i = 0; i < bytes.size() && !stop_slow.load(); ++i) {
            if (!sendAll(slow, &bytes[i], 1)) {
                return;
            }
            std::this_thread::sleep_for(150ms);
        }
    });

    // Meanwhile a real peer connects, writes and is acknowledged.
    auto [ls, remote] = a->lookup("node-b", "recv");
    ASSERT_TRUE(ls.isOk()) << ls.message();
    auto [ps, op] = a->post("node-b", src, 0, remote.id, 0, 1 << 20, 3);
    ASSERT_TRUE(ps.isOk());
    auto c = a->sink.completion(op, 5s);
    ASSERT_TRUE(c && c->code == Code::kOk);
    EXPECT_EQ(0, std::memcmp(dst->base, src->base, 1 << 20));

    // The handshake deadline is connect_timeout_ms (1000 ms in these tests).
    auto tg = waitClosed(garbage, 3s);
    auto th = waitClosed(huge, 3s);
    auto ts = waitClosed(silent, 3s);
    auto tl = waitClosed(slow, 3s);
    stop_slow.store(true);
    dribbler.join();
    ASSERT_TRUE(tg && th && ts && tl);
    EXPECT_LT(tg->count(), 500);
    EXPECT_LT(th->count(), 500);
    EXPECT_LT(ts->count(), 1800);
    EXPECT_LT(tl->count(), 1800);
    for (int fd : {garbage, huge, silent, slow}) {
        ::close(fd);
    }
    auto l = listenerStatus(*b);
    EXPECT_GE(l["rejected"].get<int>(), 4);
    EXPECT_EQ(l["pending_handshakes"], 0);
    EXPECT_TRUE(peerLogHas({"127.0.0.1", "not a tensorlane peer handshake"}));
    EXPECT_TRUE(peerLogHas({"127.0.0.1", "half-open or slow"}));
    EXPECT_TRUE(peerLogHas({"exceeds the limit"}));

    // Still healthy.
    auto [ps2, op2] = a->post("node-b", src, 0, remote.id, 0, 4096, 4);
    ASSERT_TRUE(ps2.isOk());
    auto c2 = a->sink.completion(op2, 5s);
    ASSERT_TRUE(c2 && c2->code == Code::kOk);
}

TEST_F(PeerSecurity, ConnectionFloodIsBoundedAndClearsAtTheDeadline) {
    const auto k = dir_.writeFile("k", kSecret);
    const uint16_t pa = freePort(), pb = freePort();
    auto a = makeNode("node-a", pa, k, {{"node-b", pb}});
    auto b = makeNode("node-b", pb, k, {{"node-a", pa}});
    b->addRegion(4096, "r");
    std::vector<int> fds;
    for (int i = 0; i < 100; ++i) {
        fds.push_back(rawConnect(pb));
    }
    // The listener takes them in as fast as it can, and never holds more than one address's
    // quota at once (16: they all come from 127.0.0.1, node-a's address); each one past it
    // closes the oldest that has sent nothing.
    int most = 0;
    const auto sample_until = Clock::now() + 300ms;
    while (Clock::now() < sample_until) {
        most = std::max(most, listenerStatus(*b)["pending_handshakes"].get<int>());
    }
    EXPECT_EQ(most, 16) << "the bound is 16 pending handshakes from one address, and 100 tried";
    // All are gone after the handshake deadline; then a real peer gets in.
    for (int fd : fds) {
        EXPECT_TRUE(waitClosed(fd, 3s).has_value());
        ::close(fd);
    }
    EXPECT_EQ(listenerStatus(*b)["pending_handshakes"], 0);
    auto [s, rr] = a->lookup("node-b", "r");
    EXPECT_TRUE(s.isOk()) << s.message();
}

TEST_F(PeerSecurity, ReplayedHandshakeIsRefused) {
    const auto k = dir_.writeFile("k", kSecret);
    const uint16_t pb = freePort();
    auto b = makeNode("node-b", pb, k, {{"node-a", freePort()}});
    b->addRegion(4096, "r");

    sidecar::PeerKey key;
    ASSERT_TRUE(sidecar::PeerKey::fromText(kSecret, &key).isOk());
    sidecar::HandshakeIdentity id{"node-a", 42, {1500, 250}};

    // A genuine handshake, recorded by an eavesdropper.
    sidecar::ClientHandshake hs(key, id, "node-b", sidecar::LinkRole::kControl, 0, 0);
    int fd = rawConnect(pb);
    const auto hello = frame(sidecar::FrameType::kHello, hs.hello());
    ASSERT_TRUE(sendAll(fd, hello.data(), hello.size()));
    sidecar::FrameHeader h;
    std::vector<uint8_t> payload, auth_payload;
    ASSERT_TRUE(readFrame(fd, &h, &payload, 2s));
    ASSERT_EQ(h.type, sidecar::FrameType::kChallenge);
    sidecar::HandshakeOutcome out;
    ASSERT_TRUE(hs.onChallenge(payload, &auth_payload, &out).isOk());
    const auto auth = frame(sidecar::FrameType::kAuth, auth_payload);
    ASSERT_TRUE(sendAll(fd, auth.data(), auth.size()));
    ASSERT_TRUE(readFrame(fd, &h, &payload, 2s));
    EXPECT_EQ(h.type, sidecar::FrameType::kRegionAdd);  // accepted: the snapshot follows
    ::close(fd);

    // The replay: same HELLO, same AUTH, on a new connection.
    int replay = rawConnect(pb);
    ASSERT_TRUE(sendAll(replay, hello.data(), hello.size()));
    ASSERT_TRUE(readFrame(replay, &h, &payload, 2s));
    ASSERT_EQ(h.type, sidecar::FrameType::kChallenge);
    ASSERT_TRUE(sendAll(replay, auth.data(), auth.size()));
    ASSERT_TRUE(readFrame(replay, &h, &payload, 2s));
    EXPECT_EQ(h.type, sidecar::FrameType::kRefuse);
    const std::string why(payload.begin(), payload.end());
    EXPECT_NE(why.find("authentication failed"), std::string::npos) << why;
    EXPECT_TRUE(waitClosed(replay, 2s).has_value());
    ::close(replay);
    const std::string last = listenerStatus(*b)["last_rejection"];
    EXPECT_NE(last.find("replayed"), std::string::npos) << last;
}

TEST_F(PeerSecurity, MissingOrOpenKeyFileFailsToStart) {
    config::Config cfg;
    cfg.node.name = "node-a";
    cfg.peers.push_back({"node-b", {"127.0.0.1", 1}});
    sidecar::RegionTable regions;
    sidecar::TransportSet transports;
    ASSERT_TRUE(sidecar::addRemoteTransports(cfg, regions, &transports).isOk());
    Status err;
    cfg.security.peer_key_file = dir_.path() + "/nope";
    EXPECT_EQ(sidecar::makePeerManager(cfg, regions, transports, &err), nullptr);
    EXPECT_NE(err.message().find("nope"), std::string::npos) << err.message();
    cfg.security.peer_key_file = dir_.writeFile("open", kSecret, 0644);
    EXPECT_EQ(sidecar::makePeerManager(cfg, regions, transports, &err), nullptr);
    EXPECT_EQ(err.code(), Code::kPermission);
    // A node without peers needs no key.
    cfg.peers.clear();
    cfg.security.peer_key_file = dir_.path() + "/nope";
    EXPECT_NE(sidecar::makePeerManager(cfg, regions, transports, &err), nullptr);
}

// ----- who may connect, and as whom (issue 19)

/// A fresh node-b at 127.0.0.2 looks up node-a's region `r` (a new session, so a new
/// handshake at node-a) `rounds` times, while whatever the test set up goes on.
void expectFreshPeerGetsIn(const std::function<std::unique_ptr<Node>()> &make_b, int rounds) {
    for (int round = 0; round < rounds; ++round) {
        auto b = make_b();
        const auto t0 = Clock::now();
        auto [s, rr] = b->lookup("node-a", "r", 5s);
        EXPECT_TRUE(s.isOk()) << "round " << round << ": " << s.message();
        EXPECT_LT(msSince(t0), 1000) << "round " << round;
        // The flood goes on past a handshake deadline (connect_timeout_ms, 1000 ms here).
        std::this_thread::sleep_for(600ms);
    }
}

TEST_F(PeerSecurity, SilentFloodFromAnAddressOfNoPeerIsClosedAtAccept) {
    // Before: 100 silent connections held the 64 handshake slots, and every lookup from a
    // configured peer failed while they stayed.
    const auto k = dir_.writeFile("k", kSecret);
    const uint16_t pa = freePort(), pb = freePort();
    auto a = makeNodeAt("node-a", "127.0.0.1", pa, k, {{"node-b", pb}}, {"127.0.0.2"});
    a->addRegion(4096, "r");
    Flooder flood(pa, "127.0.0.6", 100);
    ASSERT_TRUE(waitUntil([&] { return flood.opened() >= 100; }, 5s));
    expectFreshPeerGetsIn(
        [&] {
            return makeNodeAt("node-b", "127.0.0.2", pb, k, {{"node-a", pa}}, {"127.0.0.1"});
        },
        2);
    auto l = listenerStatus(*a);
    EXPECT_GE(l.value("unlisted_dropped", 0), 100) << l.dump();
    EXPECT_LE(l["pending_handshakes"].get<int>(), 3) << l.dump();
    EXPECT_TRUE(peerLogHas({"127.0.0.6", "no [[peers]] entry is at this address"}));
}

TEST_F(PeerSecurity, SilentFloodFromOneAllowedSourceTakesOnlyItsShare) {
    // With allow_unlisted_peers, strangers reach the handshake, but one source holds at most
    // max_pending_per_source (16) of the slots, and configured peers have slots of their own.
    const auto k = dir_.writeFile("k", kSecret);
    const uint16_t pa = freePort(), pb = freePort();
    auto a = makeNodeAt("node-a", "127.0.0.1", pa, k, {{"node-b", pb}}, {"127.0.0.2"},
                        [](config::Config &c) { c.security.allow_unlisted_peers = true; });
    a->addRegion(4096, "r");
    Flooder flood(pa, "127.0.0.5", 100);
    ASSERT_TRUE(waitUntil([&] { return flood.opened() >= 100; }, 5s));
    int most = 0;
    const auto sample_until = Clock::now() + 300ms;
    while (Clock::now() < sample_until) {
        most = std::max(most, listenerStatus(*a)["pending_handshakes"].get<int>());
    }
    EXPECT_LE(most, 16) << "one source, 100 connections";
    EXPECT_GE(most, 8) << "the flood did reach the handshake";
    expectFreshPeerGetsIn(
        [&] {
            return makeNodeAt("node-b", "127.0.0.2", pb, k, {{"node-a", pa}}, {"127.0.0.1"});
        },
        2);
    EXPECT_TRUE(peerLogHas({"127.0.0.5", "too many unauthenticated connections from 127.0.0.5"}) ||
                peerLogHas({"127.0.0.5", "closed to make room"}));
}

TEST_F(PeerSecurity, SilentFloodFromAPeersOwnAddressDoesNotKeepItOut) {
    // A flood from the address of the peer itself (another process on its host): the flood's
    // connections that sent nothing make room for the peer's, which send their HELLO at once.
    const auto k = dir_.writeFile("k", kSecret);
    const uint16_t pa = freePort(), pb = freePort();
    auto a = makeNodeAt("node-a", "127.0.0.1", pa, k, {{"node-b", pb}}, {"127.0.0.2"});
    a->addRegion(4096, "r");
    Flooder flood(pa, "127.0.0.2", 100);
    ASSERT_TRUE(waitUntil([&] { return flood.opened() >= 100; }, 5s));
    expectFreshPeerGetsIn(
        [&] {
            return makeNodeAt("node-b", "127.0.0.2", pb, k, {{"node-a", pa}}, {"127.0.0.1"});
        },
        2);
    EXPECT_LE(listenerStatus(*a)["pending_handshakes"].get<int>(), 16);
}

TEST_F(PeerSecurity, NameClaimedFromAnotherAddressIsRefusedAndTheSessionStays) {
    // node-c, a configured peer at 127.0.0.3 holding the shared key, claims node-b's name.
    // Before: it was accepted and its session replaced node-b's ("replaced by a new session
    // from the same peer"), failing node-b's writes.
    const auto k = dir_.writeFile("k", kSecret);
    const uint16_t pa = freePort(), pb = freePort();
    auto a = makeNodeAt("node-a", "127.0.0.1", pa, k, {{"node-b", pb}, {"node-c", freePort()}},
                        {"127.0.0.2", "127.0.0.3"});
    auto b = makeNodeAt("node-b", "127.0.0.2", pb, k, {{"node-a", pa}}, {"127.0.0.1"});
    auto dst = a->addRegion(1 << 16, "recv");
    auto src = b->addRegion(1 << 16);
    fillRandom(src->base, 1 << 16, 91);
    auto [ls, remote] = b->lookup("node-a", "recv");
    ASSERT_TRUE(ls.isOk()) << ls.message();
    auto [ps, op] = b->post("node-a", src, 0, remote.id, 0, 4096, 1);
    ASSERT_TRUE(ps.isOk()) << ps.message();
    auto c = b->sink.completion(op, 5s);
    ASSERT_TRUE(c && c->code == Code::kOk);
    const size_t b_states = b->sink.count(Event::Kind::kState);

    RawClientPeer impostor(kSecret, "node-b", "node-a", pa);
    impostor.bindSource("127.0.0.3");
    std::string why;
    EXPECT_FALSE(impostor.openSession(&why));
    EXPECT_NE(why.find("not accepted from 127.0.0.3"), std::string::npos) << why;
    EXPECT_TRUE(waitUntil(
        [] {
            return peerLogHas(
                {"127.0.0.3", "'node-b'", "verify_peer_address", "127.0.0.2", "untouched"});
        },
        2s));
    EXPECT_GE(listenerStatus(*a).value("claims_refused", 0), 1);

    // node-b's session is untouched: the same session carries the next write, and node-b saw
    // no state change.
    auto [ps2, op2] = b->post("node-a", src, 0, remote.id, 4096, 1 << 15, 2);
    ASSERT_TRUE(ps2.isOk()) << ps2.message();
    auto c2 = b->sink.completion(op2, 5s);
    ASSERT_TRUE(c2.has_value());
    EXPECT_EQ(c2->code, Code::kOk) << c2->reason;
    EXPECT_EQ(0, std::memcmp(dst->base + 4096, src->base, 1 << 15));
    EXPECT_EQ(b->sink.count(Event::Kind::kState), b_states);
    EXPECT_EQ(b->state("node-a"), PeerState::kUp);
    EXPECT_FALSE(peerLogHas({"node-b", "replaced by a new session"}));

    // With both switches off (NAT), the name is accepted from anywhere, as before.
    auto n = makeNodeAt("node-n", "127.0.0.1", freePort(), k, {{"node-b", pb}}, {"127.0.0.2"},
                        [](config::Config &cfg) {
                            cfg.security.verify_peer_address = false;
                            cfg.security.allow_unlisted_peers = true;
                        });
    RawClientPeer nat(kSecret, "node-b", "node-n", n->port());
    nat.bindSource("127.0.0.9");
    EXPECT_TRUE(nat.openSession(&why)) << why;
}

TEST_F(PeerSecurity, PerPairKeyCannotClaimAnotherPeer) {
    // node-a shares one key with node-b and another with node-c. A holder of the node-b key,
    // even at node-c's address, cannot authenticate as node-c; node-c's session stays.
    const auto kab = dir_.writeFile("ab", keyText('a'));
    const auto kac = dir_.writeFile("ac", keyText('c'));
    const uint16_t pa = freePort(), pb = freePort(), pc = freePort();
    auto a = makeNodeAt("node-a", "127.0.0.1", pa, kab, {{"node-b", pb}, {"node-c", pc}},
                        {"127.0.0.2", "127.0.0.3"},
                        [&](config::Config &cfg) { cfg.peers[1].key_file = kac; });
    auto b = makeNodeAt("node-b", "127.0.0.2", pb, kab, {{"node-a", pa}}, {"127.0.0.1"});
    auto cn = makeNodeAt("node-c", "127.0.0.3", pc, kac, {{"node-a", pa}}, {"127.0.0.1"});
    auto dst = a->addRegion(1 << 16, "recv");
    auto src = cn->addRegion(1 << 16);
    fillRandom(src->base, 1 << 16, 92);
    // Each pair authenticates with its own key.
    auto [lb, rb] = b->lookup("node-a", "recv");
    ASSERT_TRUE(lb.isOk()) << lb.message();
    auto [lc, remote] = cn->lookup("node-a", "recv");
    ASSERT_TRUE(lc.isOk()) << lc.message();
    auto [ps, op] = cn->post("node-a", src, 0, remote.id, 0, 4096, 1);
    ASSERT_TRUE(ps.isOk()) << ps.message();
    auto c1 = cn->sink.completion(op, 5s);
    ASSERT_TRUE(c1 && c1->code == Code::kOk);
    const size_t c_states = cn->sink.count(Event::Kind::kState);

    {
        RawClientPeer impostor(keyText('a'), "node-c", "node-a", pa);
        impostor.bindSource("127.0.0.3");
        std::string why;
        EXPECT_FALSE(impostor.openSession(&why));
        // node-a proved itself with the node-c key, which the impostor can neither check nor
        // answer (it closes here).
        EXPECT_NE(why.find("authentication failed"), std::string::npos) << why;
    }
    EXPECT_TRUE(waitUntil(
        [] {
            return peerLogHas({"dropped peer connection from 127.0.0.3", "('node-c')"});
        },
        3s));

    auto [ps2, op2] = cn->post("node-a", src, 0, remote.id, 0, 1 << 16, 2);
    ASSERT_TRUE(ps2.isOk()) << ps2.message();
    auto c2 = cn->sink.completion(op2, 5s);
    ASSERT_TRUE(c2.has_value());
    EXPECT_EQ(c2->code, Code::kOk) << c2->reason;
    EXPECT_EQ(0, std::memcmp(dst->base, src->base, 1 << 16));
    EXPECT_EQ(cn->sink.count(Event::Kind::kState), c_states);
    EXPECT_FALSE(peerLogHas({"node-c", "replaced by a new session"}));
}

}  // namespace
}  // namespace tensorlane::peertest
