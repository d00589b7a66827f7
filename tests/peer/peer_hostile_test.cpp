// Authenticated peers that break the protocol on purpose, and a man in the middle of the TCP
// connections: two chunks claiming the same bytes (once a use after free in the receiver), an
// ACK for data never sent, frames whose tags do not match, bytes changed on the wire, more
// region descriptors than the limit, and a write too large to be cut up front.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "harness.hpp"
#include "net/packed_chunk.hpp"
#include "peer/directory.hpp"
#include "peer/wire.hpp"
#include "raw_peer.hpp"
#include "transport/tcp/links.hpp"

namespace tensorlane::peertest {
namespace {

using Clock = std::chrono::steady_clock;
using sidecar::ChunkHeader;
using sidecar::FrameHeader;
using sidecar::FrameType;

/// A node that lists a raw peer "node-evil" (at `evil_port`, which it dials only on use).
std::unique_ptr<Node> victim(const std::string &key, uint16_t evil_port,
                             std::function<void(config::Config &)> tweak = {}) {
    NodeOptions o;
    o.name = "node-b";
    o.port = freePort();
    o.key_file = key;
    o.peers = {{"node-evil", evil_port}};
    o.tweak = std::move(tweak);
    return std::make_unique<Node>(o);
}

TEST(HostilePeer, TwoChunksClaimingTheSameBytesAreAProtocolError) {
    // Two full-size chunks of one write, on two data connections: both used to pass the check
    // (bytes received, not claimed), the first delivered and freed the write's record, the
    // second wrote into it. Now the second is refused and the session closed.
    TempDir dir;
    const auto key = dir.writeFile("peer.key", kSecret);
    auto b = victim(key, freePort());
    ASSERT_TRUE(b->ok()) << b->startStatus().message();
    constexpr uint32_t kLen = 1u << 20;
    auto dst = b->addRegion(kLen, "recv");
    RawClientPeer evil(kSecret, "node-evil", "node-b", b->port());
    std::string why;
    ASSERT_TRUE(evil.openSession(&why)) << why;
    ASSERT_TRUE(evil.openData(0, &why)) << why;
    ASSERT_TRUE(evil.openData(1, &why)) << why;
    ASSERT_EQ(evil.regions().size(), 1u);
    std::vector<uint8_t> data(kLen, 0x5a);
    ChunkHeader h;
    h.region = evil.regions()[0].id;
    h.total_bytes = kLen;
    h.chunk_offset = 0;
    h.imm = 1;
    // Connection 0: the header and half the data, so that its chunk is in progress when the
    // second one begins; connection 1: the same chunk, whole.
    uint8_t head[sidecar::kChunkFrameOverhead];
    sidecar::encodeChunkFrame(head, 1, h, kLen);
    uint8_t tag0[sidecar::kChunkTrailerBytes];
    evil.data(0).chunkTag(head, data.data(), kLen, tag0);
    ASSERT_TRUE(evil.data(0).sendRaw(head, sizeof head));
    ASSERT_TRUE(evil.data(0).sendRaw(data.data(), kLen / 2));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    // (The receiver may drop the session while this is on its way: the send can fail.)
    (void)evil.data(1).sendChunk(1, h, data.data(), kLen);
    (void)evil.data(0).sendRaw(data.data() + kLen / 2, kLen / 2);
    (void)evil.data(0).sendRaw(tag0, sizeof tag0);
    EXPECT_TRUE(evil.control().closedWithin(3000)) << "the session was not dropped";
    EXPECT_TRUE(peerLogHas({"node-evil", "protocol error"}));
    EXPECT_TRUE(peerLogHas({"node-evil", "already claimed"}) ||
                peerLogHas({"node-evil", "outside the window"}));
    EXPECT_LE(b->sink.count(Event::Kind::kArrived), 1u) << "one write, delivered twice";
    // The node is fine and takes a well-behaved session again.
    RawClientPeer again(kSecret, "node-evil", "node-b", b->port());
    EXPECT_TRUE(again.openSession(&why)) << why;
}

TEST(HostilePeer, ChunkWithABadTagIsRefused) {
    TempDir dir;
    const auto key = dir.writeFile("peer.key", kSecret);
    auto b = victim(key, freePort());
    ASSERT_TRUE(b->ok());
    auto dst = b->addRegion(65536, "recv");
    std::vector<unsigned char> before(dst->base, dst->base + 65536);
    RawClientPeer evil(kSecret, "node-evil", "node-b", b->port());
    std::string why;
    ASSERT_TRUE(evil.openSession(&why)) << why;
    ASSERT_TRUE(evil.openData(0, &why) && evil.openData(1, &why)) << why;
    std::vector<uint8_t> data(4096, 0x11);
    ChunkHeader h;
    h.region = evil.regions()[0].id;
    h.total_bytes = data.size();
    ASSERT_TRUE(evil.data(0).sendChunk(1, h, data.data(), 4096, /*corrupt_tag=*/true));
    EXPECT_TRUE(evil.control().closedWithin(3000));
    EXPECT_TRUE(peerLogHas({"node-evil", "authentication tag"}));
    EXPECT_EQ(b->sink.count(Event::Kind::kArrived), 0u) << "an unauthenticated write was notified";
    // A frame on control with a bad tag is refused too (an injected REGION-less heartbeat).
    RawClientPeer evil2(kSecret, "node-evil", "node-b", b->port());
    ASSERT_TRUE(evil2.openSession(&why)) << why;
    uint8_t junk[sidecar::kFrameHeaderBytes + sidecar::kFrameTagBytes] = {};
    sidecar::encodeFrameHeader(junk, FrameType::kHeartbeat, 0, 1);
    ASSERT_TRUE(evil2.control().sendRaw(junk, sizeof junk));
    EXPECT_TRUE(evil2.control().closedWithin(3000));
}

TEST(HostilePeer, AChunkWhoseDataChangedFailsItsWriteLandsNothingAndKeepsTheSession) {
    // A chunk whose data changed after it was tagged (a writer that changed its source mid-send,
    // or a path that flips data bits) while its headers are intact: nothing of it lands, its
    // write is answered with an error (kInvalid, nothing notified), and the session goes on: the
    // next write lands. A small chunk (checked on the engine thread) and a big one (read and
    // checked by a worker).
    for (const uint32_t len : {4096u, 512u << 10}) {
        SCOPED_TRACE("chunk of " + std::to_string(len) + " bytes");
        TempDir dir;
        const auto key = dir.writeFile("peer.key", kSecret);
        auto b = victim(key, freePort(), [](config::Config &c) { c.tcp.tag_threads = 2; });
        ASSERT_TRUE(b->ok());
        auto dst = b->addRegion(2 * len, "recv");
        std::memset(dst->base, 0x11, 2 * len);
        RawClientPeer evil(kSecret, "node-evil", "node-b", b->port());
        std::string why;
        ASSERT_TRUE(evil.openSession(&why)) << why;
        ASSERT_TRUE(evil.openData(0, &why) && evil.openData(1, &why)) << why;
        std::vector<uint8_t> data(len);
        fillRandom(data.data(), len, 41);
        ChunkHeader h;
        h.region = evil.regions()[0].id;
        h.total_bytes = len;
        h.imm = 5;
        ASSERT_TRUE(evil.data(0).sendChunk(1, h, data.data(), len, RawConn::Tamper::kDataChanged));
        FrameHeader fh;
        std::vector<uint8_t> ack;
        ASSERT_TRUE(evil.data(0).recvType(FrameType::kAck, &fh, &ack)) << "no ACK for the write";
        EXPECT_EQ(fh.arg, 1u);
        ASSERT_GE(ack.size(), 8u);
        EXPECT_EQ(sidecar::loadLe32(ack.data()), static_cast<uint32_t>(Code::kInvalid));
        EXPECT_EQ(sidecar::loadLe32(ack.data() + 4), 1u) << "the ACK does not say the data changed";
        EXPECT_EQ(b->sink.count(Event::Kind::kArrived), 0u) << "a changed chunk was notified";
        EXPECT_TRUE(std::all_of(dst->base, dst->base + 2 * len, [](uint8_t x) {
            return x == 0x11;
        })) << "a changed chunk landed";
        EXPECT_EQ(peerStatus(*b, "node-evil")["chunks_data_changed"], 1);
        // The session goes on: the next write lands and is notified.
        h.write_offset = len;
        h.imm = 6;
        ASSERT_TRUE(evil.data(1).sendChunk(2, h, data.data(), len));
        ASSERT_TRUE(b->sink.waitFor(
            [](const std::vector<Event> &ev) {
                return std::any_of(ev.begin(), ev.end(),
                                   [](const Event &e) { return e.kind == Event::Kind::kArrived; });
            },
            3s));
        EXPECT_EQ(0, std::memcmp(dst->base + len, data.data(), len));
        EXPECT_FALSE(evil.control().closedWithin(100)) << "the session was dropped";
    }
}

TEST(HostilePeer, ATcpPeerOfTheOlderChunkFormatIsRefusedNamingBothVersions) {
    // Version 4 of the tcp transport put a header tag in every chunk's trailer: a peer of
    // version 3 would frame chunks 16 bytes short, so it is refused at SELECT, with both
    // versions named, and nothing of it is read as a chunk.
    TempDir dir;
    const auto key = dir.writeFile("peer.key", kSecret);
    auto b = victim(key, freePort());
    ASSERT_TRUE(b->ok());
    RawClientPeer old(kSecret, "node-evil", "node-b", b->port());
    std::vector<uint8_t> blob = sidecar::encodeTcpBlob(2, 1u << 20);
    ASSERT_GE(blob.size(), 2u);
    blob[0] = 3;
    blob[1] = 0;
    std::vector<uint8_t> selected;
    std::string why;
    EXPECT_FALSE(old.openSession(sidecar::kTransportTcp, blob, &selected, &why));
    const std::vector<std::string> refusal = {
        "node-evil", "version " + std::to_string(sidecar::kTcpBlobVersion), "version 3"};
    for (int i = 0; i < 200 && !peerLogHas(refusal); ++i) {
        std::this_thread::sleep_for(10ms);  // logged by the node's thread as it closes
    }
    EXPECT_TRUE(peerLogHas(refusal)) << "the refusal does not name both versions";
}

TEST(HostilePeer, ARegionNotOfferedToPeersCannotBeWrittenByGuessingItsId) {
    // tl_expose_access without TL_ACCESS_PEERS: the peer is never told of the region, and a
    // write that names its (sequential, guessable) id is refused, nothing written or notified.
    TempDir dir;
    const auto key = dir.writeFile("peer.key", kSecret);
    auto b = victim(key, freePort());
    ASSERT_TRUE(b->ok());
    auto offered = b->addRegion(65536, "recv");
    auto hidden = b->addRegion(65536, "");
    b->exposeLocally(hidden, "local-only");
    std::vector<unsigned char> before(hidden->base, hidden->base + 65536);
    RawClientPeer evil(kSecret, "node-evil", "node-b", b->port());
    std::string why;
    ASSERT_TRUE(evil.openSession(&why)) << why;
    ASSERT_TRUE(evil.openData(0, &why)) << why;
    ASSERT_EQ(evil.regions().size(), 1u) << "a local-only region was described to a peer";
    EXPECT_EQ(evil.regions()[0].id, offered->id);
    std::vector<uint8_t> data(4096, 0x66);
    ChunkHeader h;
    h.region = hidden->id;
    h.total_bytes = data.size();
    h.imm = 9;
    ASSERT_TRUE(evil.data(0).sendChunk(1, h, data.data(), data.size()));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(b->sink.count(Event::Kind::kArrived), 0u) << "a write into a hidden region arrived";
    EXPECT_TRUE(std::equal(before.begin(), before.end(), hidden->base))
        << "a peer changed a region that was not offered to peers";
}

TEST(HostilePeer, BigChunkWithABadTagIsRefusedWhenWorkersCheckIt) {
    // A chunk big enough for the tag pool, with a wrong tag, then a good one of the same write:
    // the pool's verdict ends the session and neither is ever counted or notified.
    TempDir dir;
    const auto key = dir.writeFile("peer.key", kSecret);
    auto b = victim(key, freePort(), [](config::Config &c) { c.tcp.tag_threads = 2; });
    ASSERT_TRUE(b->ok());
    constexpr uint32_t kLen = 512u << 10;
    auto dst = b->addRegion(2 * kLen, "recv");
    RawClientPeer evil(kSecret, "node-evil", "node-b", b->port());
    std::string why;
    ASSERT_TRUE(evil.openSession(&why)) << why;
    ASSERT_TRUE(evil.openData(0, &why) && evil.openData(1, &why)) << why;
    std::vector<uint8_t> data(kLen, 0x5a);
    ChunkHeader h;
    h.region = evil.regions()[0].id;
    h.total_bytes = 2 * kLen;
    ASSERT_TRUE(evil.data(0).sendChunk(1, h, data.data(), kLen, /*corrupt_tag=*/true));
    h.chunk_offset = kLen;
    (void)evil.data(1).sendChunk(1, h, data.data(), kLen, /*corrupt_tag=*/false);
    EXPECT_TRUE(evil.control().closedWithin(3000));
    EXPECT_TRUE(peerLogHas({"node-evil", "authentication tag"}));
    EXPECT_EQ(b->sink.count(Event::Kind::kArrived), 0u) << "an unauthenticated write was notified";
    auto st = peerStatus(*b, "node-evil");
    EXPECT_EQ(st["tag_threads"], 2);
    EXPECT_GE(st["tags_offloaded"].get<uint64_t>(), 1u)
        << "the chunk's tag was not checked by the pool";
    // The node takes a well-behaved session again.
    RawClientPeer again(kSecret, "node-evil", "node-b", b->port());
    EXPECT_TRUE(again.openSession(&why)) << why;
}

TEST(HostilePeer, ChunksWorkersReadLandWholeAfterAStallAndNotAtAllWhenCutOff) {
    // Big chunks are read from the socket by the victim's tag workers. One whose sender pauses
    // halfway, longer than a worker waits (TagPool::kSocketRunUs), is handed back to the engine,
    // read on by a worker when its bytes come (its tag too arriving in two pieces), and lands
    // whole. One whose connection closes halfway lands nothing and ends the session, and the
    // node takes sessions again.
    TempDir dir;
    const auto key = dir.writeFile("peer.key", kSecret);
    auto b = victim(key, freePort(), [](config::Config &c) { c.tcp.tag_threads = 2; });
    ASSERT_TRUE(b->ok()) << b->startStatus().message();
    constexpr uint32_t kLen = 1u << 20;
    auto dst = b->addRegion(2 * kLen, "recv");
    std::memset(dst->base, 0x11, 2 * kLen);
    RawClientPeer evil(kSecret, "node-evil", "node-b", b->port());
    std::string why;
    ASSERT_TRUE(evil.openSession(&why)) << why;
    ASSERT_TRUE(evil.openData(0, &why) && evil.openData(1, &why)) << why;
    std::vector<uint8_t> data(kLen);
    fillRandom(data.data(), kLen, 31);
    ChunkHeader h;
    h.region = evil.regions()[0].id;
    h.total_bytes = kLen;
    h.imm = 3;
    uint8_t head[sidecar::kChunkFrameOverhead];
    sidecar::encodeChunkFrame(head, 1, h, kLen);
    uint8_t tag[sidecar::kChunkTrailerBytes];
    RawConn &c0 = evil.data(0);
    c0.chunkTag(head, data.data(), kLen, tag);
    constexpr uint32_t kFirst = 300u << 10;
    ASSERT_TRUE(c0.sendRaw(head, sizeof head));
    ASSERT_TRUE(c0.sendRaw(data.data(), kFirst));
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    EXPECT_EQ(b->sink.count(Event::Kind::kArrived), 0u);
    ASSERT_TRUE(c0.sendRaw(data.data() + kFirst, kLen - kFirst - 100));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_TRUE(c0.sendRaw(data.data() + kLen - 100, 100));
    ASSERT_TRUE(c0.sendRaw(tag, 10));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(b->sink.count(Event::Kind::kArrived), 0u) << "notified before its tag was whole";
    ASSERT_TRUE(c0.sendRaw(tag + 10, sizeof tag - 10));
    ASSERT_TRUE(b->sink.waitFor(
        [](const std::vector<Event> &ev) {
            return std::any_of(ev.begin(), ev.end(),
                               [](const Event &e) { return e.kind == Event::Kind::kArrived; });
        },
        3s));
    EXPECT_EQ(0, std::memcmp(dst->base, data.data(), kLen)) << "the stalled chunk did not land";
    EXPECT_GE(peerStatus(*b, "node-evil")["chunks_read_by_tag_workers"].get<uint64_t>(), 1u)
        << "no worker read the chunk";
    // The second write: half a chunk, then the connection closes.
    h.write_offset = kLen;
    h.imm = 4;
    sidecar::encodeChunkFrame(head, 2, h, kLen);
    ASSERT_TRUE(c0.sendRaw(head, sizeof head));
    ASSERT_TRUE(c0.sendRaw(data.data(), 400u << 10));
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    evil.data(0) = RawConn();
    EXPECT_TRUE(evil.control().closedWithin(3000)) << "the session was not dropped";
    EXPECT_TRUE(peerLogHas({"node-evil", "data connection closed by the peer"}));
    EXPECT_EQ(b->sink.count(Event::Kind::kArrived), 1u);
    EXPECT_TRUE(std::all_of(dst->base + kLen, dst->base + 2 * kLen, [](uint8_t v) {
        return v == 0x11;
    })) << "bytes of a chunk cut off halfway reached the region";
    RawClientPeer again(kSecret, "node-evil", "node-b", b->port());
    EXPECT_TRUE(again.openSession(&why)) << why;
}

TEST(HostilePeer, EarlyAckIsAProtocolErrorAndTheWriteFails) {
    // The target acknowledges a 64 MiB write after its first chunk. The writer used to report
    // TL_OK for data never sent (and its socket then read freed memory if the source went).
    TempDir dir;
    const auto key = dir.writeFile("peer.key", kSecret);
    RawServerPeer evil(kSecret, "node-evil");
    NodeOptions o;
    o.name = "node-a";
    o.port = freePort();
    o.key_file = key;
    o.peers = {{"node-evil", evil.port()}};
    Node a(o);
    ASSERT_TRUE(a.ok());
    std::atomic<bool> served{false};
    std::string why;
    std::thread server([&] {
        sidecar::RegionDescriptor sink{1, 64u << 20, "sink"};
        if (!evil.acceptSession(sink, &why) || !evil.acceptData(&why)) {
            return;
        }
        served = true;
        // Read one chunk header, then claim the whole write landed.
        FrameHeader h;
        std::vector<uint8_t> p;
        uint8_t head[sidecar::kChunkFrameOverhead];
        pollfd pf{evil.data(0).fd(), POLLIN, 0};
        if (::poll(&pf, 1, 5000) > 0 &&
            ::recv(evil.data(0).fd(), head, sizeof head, MSG_WAITALL) == sizeof head) {
            uint8_t ack[8] = {};
            evil.data(0).send(FrameType::kAck, 1, ack);
        }
        evil.control().closedWithin(5000);
    });
    auto [ls, remote] = a.lookup("node-evil", "sink");
    ASSERT_TRUE(ls.isOk()) << ls.message() << why;
    auto src = a.addRegion(64u << 20);
    auto [ps, op] = a.post("node-evil", src, 0, remote.id, 0, 64u << 20, 7);
    ASSERT_TRUE(ps.isOk()) << ps.message();
    auto c = a.sink.completion(op, 10s);
    server.join();
    ASSERT_TRUE(served.load()) << why;
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(c->code, Code::kPeer) << "an early ACK was taken for delivery: " << c->reason;
    EXPECT_TRUE(peerLogHas({"node-evil", "before all of it was sent"}));
}

TEST(HostilePeer, AnAckAnywhereButDataConnectionZeroIsAProtocolError) {
    // Since protocol version 3 a tcp target acknowledges on data connection 0 only; an ACK on
    // the control connection (where version 2 sent them) or on another data connection must
    // not end a write: the session fails and the write ends TL_EPEER.
    for (const bool on_control : {true, false}) {
        SCOPED_TRACE(on_control ? "ACK on the control connection" : "ACK on data connection 1");
        TempDir dir;
        const auto key = dir.writeFile("peer.key", kSecret);
        RawServerPeer evil(kSecret, "node-evil");
        NodeOptions o;
        o.name = "node-a";
        o.port = freePort();
        o.key_file = key;
        o.peers = {{"node-evil", evil.port()}};
        Node a(o);
        ASSERT_TRUE(a.ok());
        std::atomic<bool> served{false};
        std::string why;
        std::thread server([&] {
            sidecar::RegionDescriptor sink{1, 4096, "sink"};
            if (!evil.acceptSession(sink, &why) || !evil.acceptData(&why)) {
                return;
            }
            served = true;
            // Wait until the whole (one-chunk) write has come, then acknowledge it wrongly.
            uint8_t buf[4096 + sidecar::kChunkFrameOverhead + 64];
            pollfd pf[2] = {{evil.data(0).fd(), POLLIN, 0}, {evil.data(1).fd(), POLLIN, 0}};
            if (::poll(pf, 2, 5000) > 0) {
                for (const pollfd &f : pf) {
                    if ((f.revents & POLLIN) != 0) {
                        (void)::recv(f.fd, buf, sizeof buf, MSG_DONTWAIT);
                    }
                }
            }
            uint8_t ack[8] = {};
            if (on_control) {
                evil.control().send(FrameType::kAck, 1, ack);
            } else {
                evil.data(1).send(FrameType::kAck, 1, ack);
            }
            evil.control().closedWithin(5000);
        });
        auto [ls, remote] = a.lookup("node-evil", "sink");
        ASSERT_TRUE(ls.isOk()) << ls.message() << why;
        auto src = a.addRegion(4096);
        auto [ps, op] = a.post("node-evil", src, 0, remote.id, 0, 4096, 7);
        ASSERT_TRUE(ps.isOk()) << ps.message();
        auto c = a.sink.completion(op, 10s);
        server.join();
        ASSERT_TRUE(served.load()) << why;
        ASSERT_TRUE(c.has_value());
        EXPECT_EQ(c->code, Code::kPeer) << "a misplaced ACK ended the write: " << c->reason;
        EXPECT_TRUE(peerLogHas({"node-evil", "unexpected ACK"}));
    }
}

TEST(HostilePeer, APackedChunkWhoseTableIsBadLandsNothing) {
    // Packed chunks (tcp wire version 3) carry several extents behind a table that says where
    // each lands. An authenticated peer sends tables that point outside the region, overflow,
    // or do not add up: the write is refused (kNotFound) and no byte of it lands; counts the
    // header cannot have are protocol errors. A good table, the control, lands its pieces.
    TempDir dir;
    const auto key = dir.writeFile("peer.key", kSecret);
    auto b = victim(key, freePort());
    ASSERT_TRUE(b->ok()) << b->startStatus().message();
    constexpr uint64_t kRegion = 65536;
    auto dst = b->addRegion(kRegion, "recv");
    std::memset(dst->base, 0, kRegion);
    RawClientPeer evil(kSecret, "node-evil", "node-b", b->port());
    std::string why;
    ASSERT_TRUE(evil.openSession(&why)) << why;
    ASSERT_TRUE(evil.openData(0, &why)) << why;
    struct P {
        uint64_t dst, bytes;
    };
    // A packed chunk of `pieces` whose data bytes are `fill`, claiming `payload` bytes of data.
    auto send = [&](uint64_t seq, const std::vector<P> &pieces, uint64_t payload, uint8_t fill,
                    uint64_t count) {
        const size_t table = sidecar::packedTableBytes(static_cast<uint32_t>(pieces.size()));
        std::vector<uint8_t> data(table + payload, fill);
        for (size_t i = 0; i < pieces.size(); ++i) {
            sidecar::encodePackedEntry(data.data(), static_cast<uint32_t>(i), pieces[i].dst,
                                       pieces[i].bytes);
        }
        ChunkHeader h;
        h.region = evil.regions()[0].id;
        h.total_bytes = payload;
        h.chunk_offset = 0;
        h.write_offset = count;
        h.flags = sidecar::kChunkSilent | sidecar::kChunkScatter | sidecar::kChunkPacked;
        return evil.data(0).sendChunk(seq, h, data.data(), static_cast<uint32_t>(data.size()));
    };
    auto ackOf = [&](uint64_t seq) {
        FrameHeader h;
        std::vector<uint8_t> p;
        if (!evil.data(0).recvType(FrameType::kAck, &h, &p, 5000) || h.arg != seq || p.size() < 4) {
            return static_cast<Code>(-1);
        }
        return static_cast<Code>(sidecar::loadLe32(p.data()));
    };
    const std::vector<uint8_t> zero(kRegion, 0);
    // outside: the second piece runs 90 bytes past the end
    ASSERT_TRUE(send(1, {{0, 100}, {kRegion - 10, 100}}, 200, 0xa1, 2));
    EXPECT_EQ(ackOf(1), Code::kNotFound);
    // an offset that wraps around when its length is added
    ASSERT_TRUE(send(2, {{100, 100}, {~uint64_t{0} - 50, 100}}, 200, 0xa2, 2));
    EXPECT_EQ(ackOf(2), Code::kNotFound);
    // the pieces add up to less than the data that follows the table
    ASSERT_TRUE(send(3, {{0, 100}, {1000, 50}}, 200, 0xa3, 2));
    EXPECT_EQ(ackOf(3), Code::kNotFound);
    // an empty piece
    ASSERT_TRUE(send(4, {{0, 200}, {1000, 0}}, 200, 0xa4, 2));
    EXPECT_EQ(ackOf(4), Code::kNotFound);
    EXPECT_EQ(0, std::memcmp(dst->base, zero.data(), kRegion)) << "a bad table landed bytes";
    // the control: a good table lands both pieces where it says, and nothing else
    ASSERT_TRUE(send(5, {{4096, 100}, {8192, 300}}, 400, 0x5c, 2));
    EXPECT_EQ(ackOf(5), Code::kOk);
    for (uint64_t i = 0; i < kRegion; ++i) {
        const bool in = (i >= 4096 && i < 4196) || (i >= 8192 && i < 8492);
        ASSERT_EQ(dst->base[i], in ? 0x5c : 0) << i;
    }
    EXPECT_EQ(b->sink.count(Event::Kind::kArrived), 0u) << "scattered writes are silent";
    // a count the header cannot have: the table would not fit, or too many entries
    // (refused on its header: the rest of it may find the connection closed)
    (void)send(6, {{0, 8}}, 8, 0x66, sidecar::kMaxPackedPieces + 1);
    EXPECT_TRUE(evil.control().closedWithin(3000)) << "a packed chunk of 257 entries was taken";
    EXPECT_TRUE(peerLogHas({"node-evil", "packed chunk"}));
    EXPECT_EQ(0, std::memcmp(dst->base + 16384, zero.data(), kRegion - 16384));
}

TEST(HostilePeer, MoreRegionsThanTheLimitAreIgnored) {
    TempDir dir;
    const auto key = dir.writeFile("peer.key", kSecret);
    const uint16_t pa = freePort(), pb = freePort();
    NodeOptions oa{.name = "node-a", .port = pa, .key_file = key, .peers = {{"node-b", pb}}};
    oa.tweak = [](config::Config &c) { c.limits.peer_regions = 3; };
    NodeOptions ob{.name = "node-b", .port = pb, .key_file = key, .peers = {{"node-a", pa}}};
    Node a(oa), b(ob);
    ASSERT_TRUE(a.ok() && b.ok());
    for (int i = 0; i < 3; ++i) {
        b.addRegion(4096, "early-" + std::to_string(i));
    }
    ASSERT_TRUE(a.lookup("node-b", "early-0").first.isOk());
    // Described after the session came up: over the limit, ignored, counted.
    b.addRegion(4096, "late-0");
    b.addRegion(4096, "late-1");
    auto st = peerStatus(a, "node-b");
    for (int i = 0; i < 100 && st["remote_regions_ignored"] != 2; ++i) {
        std::this_thread::sleep_for(10ms);
        st = peerStatus(a, "node-b");
    }
    EXPECT_EQ(st["remote_regions"], 3);
    EXPECT_EQ(st["remote_regions_ignored"], 2);
    auto [s, rr] = a.lookup("node-b", "late-1");
    EXPECT_EQ(s.code(), Code::kNotFound);
    EXPECT_NE(s.message().find("peer_regions"), std::string::npos) << s.message();
    EXPECT_TRUE(peerLogHas({"node-b", "peer_regions"}));
}

TEST(Directory, RevokedAndRestartedHandlesBecomeBoundedTombstones) {
    sidecar::RegionDirectory d(100, /*max_tombstones=*/16);
    d.replace(1, 0xaa, {});
    std::vector<uint64_t> handles;
    for (uint64_t i = 1; i <= 1000; ++i) {
        ASSERT_TRUE(d.add(1, sidecar::RegionDescriptor{i, 4096, "r" + std::to_string(i)}));
        auto h = d.lookup(1, "r" + std::to_string(i));
        ASSERT_TRUE(h.has_value());
        EXPECT_EQ(d.lookup(1, "r" + std::to_string(i))->id, h->id) << "one handle per region";
        handles.push_back(h->id);
        d.remove(1, i);
    }
    EXPECT_EQ(d.handleCount(), 0u);
    EXPECT_EQ(d.tombstoneCount(), 16u);
    std::string why;
    EXPECT_FALSE(d.resolve(1, handles.back(), &why).has_value());
    EXPECT_NE(why.find("revoked"), std::string::npos) << why;
    // A restart turns live handles into tombstones too.
    ASSERT_TRUE(d.add(1, sidecar::RegionDescriptor{5000, 64, "x"}));
    auto live = d.lookup(1, "x");
    ASSERT_TRUE(live && d.resolve(1, live->id, &why).has_value());
    d.replace(1, 0xbb, {{5000, sidecar::RegionDescriptor{5000, 64, "x"}}});
    EXPECT_FALSE(d.resolve(1, live->id, &why).has_value());
    EXPECT_NE(why.find("earlier run"), std::string::npos) << why;
    EXPECT_NE(d.lookup(1, "x")->id, live->id) << "the new run gets a new handle";
}

TEST(PeerTcpBounds, TerabyteWriteIsCutAsTheSocketsDrain) {
    // A 1 TiB write to a peer that does not read: posting it must not build 2^20 chunk items
    // (or 2^28 of 4 KiB): only a few chunks are cut, the rest waits behind the cursor.
    TempDir dir;
    const auto key = dir.writeFile("peer.key", kSecret);
    const uint16_t pa = freePort(), pb = freePort();
    Node a(NodeOptions{.name = "node-a", .port = pa, .key_file = key, .peers = {{"node-b", pb}}});
    Node b(NodeOptions{.name = "node-b", .port = pb, .key_file = key, .peers = {{"node-a", pa}}});
    ASSERT_TRUE(a.ok() && b.ok());
    constexpr uint64_t kTiB = uint64_t{1} << 40;
    void *p = ::mmap(nullptr, kTiB, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        GTEST_SKIP() << "cannot reserve 1 TiB of address space here";
    }
    auto src = std::make_shared<Region>();
    src->base = static_cast<unsigned char *>(p);
    src->bytes = kTiB;
    b.addRegion(kTiB / (1u << 20), "small");  // 1 MiB
    // The remote region is small; post straight to the transport with a fake, larger one, as
    // a client of a lying engine could not: this is about the sender's memory only.
    auto [ls, remote] = a.lookup("node-b", "small");
    ASSERT_TRUE(ls.isOk());
    b.pause(true);
    const auto t0 = Clock::now();
    const uint64_t op_id = nextOpId();
    Status s = a.call([&] {
        sidecar::WriteOp op;
        op.op_id = op_id;
        op.peer = *a.pm().peerByName("node-b");
        op.src = src;
        op.dst_region = remote.id;
        op.remote_region = 999;
        op.bytes = kTiB;
        return a.transports().post(op);
    });
    ASSERT_TRUE(s.isOk()) << s.message();
    EXPECT_LT(Clock::now() - t0, 1s) << "post() cut the whole write up front";
    std::this_thread::sleep_for(200ms);
    auto st = peerStatus(a, "node-b");
    EXPECT_LE(st["queued_bytes"].get<uint64_t>(), uint64_t{8} << 20) << st.dump();
    EXPECT_GT(st["uncut_bytes"].get<uint64_t>(), kTiB - (uint64_t{1} << 30)) << st.dump();
    // The peer stays silent: the write fails with TL_EPEER, once.
    auto c = a.sink.completion(op_id, 10s);
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(c->code, Code::kPeer);
    b.pause(false);
    ::munmap(p, kTiB);
}

/// A TCP relay between a node and its peer that changes one byte: the `flip_at`-th byte that
/// the `conn_index`-th accepted connection carries towards the peer (counting from 0).
class TamperingProxy {
public:
    TamperingProxy(uint16_t target_port, int conn_index, uint64_t flip_at)
        : target_(target_port), conn_index_(conn_index), flip_at_(flip_at) {
        listen_ = listenOnLoopback(&port_);
        thread_ = std::thread([this] { run(); });
    }
    ~TamperingProxy() {
        stop_ = true;
        thread_.join();
        ::close(listen_);
        for (auto &[a, b] : pairs_) {
            ::close(a);
            ::close(b);
        }
    }
    uint16_t port() const { return port_; }
    bool flipped() const { return flipped_.load(); }

private:
    void run() {
        std::vector<uint64_t> sent;  // client -> target bytes, per pair
        while (!stop_) {
            std::vector<pollfd> fds{{listen_, POLLIN, 0}};
            for (auto &[a, b] : pairs_) {
                fds.push_back({a, POLLIN, 0});
                fds.push_back({b, POLLIN, 0});
            }
            if (::poll(fds.data(), fds.size(), 20) <= 0) {
                continue;
            }
            if (fds[0].revents & POLLIN) {
                int c = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
                int t = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
                sockaddr_in a{};
                a.sin_family = AF_INET;
                a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
                a.sin_port = htons(target_);
                ::connect(t, reinterpret_cast<sockaddr *>(&a), sizeof a);
                pairs_.push_back({c, t});
                sent.push_back(0);
            }
            // Only the pairs that were polled: one accepted just now has no entries in fds.
            const size_t polled = (fds.size() - 1) / 2;
            for (size_t i = 0; i < polled; ++i) {
                for (int dir = 0; dir < 2; ++dir) {
                    const pollfd &p = fds[1 + 2 * i + dir];
                    if ((p.revents & (POLLIN | POLLHUP | POLLERR)) == 0) {
                        continue;
                    }
                    const int from = dir == 0 ? pairs_[i].first : pairs_[i].second;
                    const int to = dir == 0 ? pairs_[i].second : pairs_[i].first;
                    uint8_t buf[65536];
                    ssize_t n = ::recv(from, buf, sizeof buf, MSG_DONTWAIT);
                    if (n <= 0) {
                        ::shutdown(to, SHUT_WR);
                        continue;
                    }
                    if (dir == 0 && static_cast<int>(i) == conn_index_ && !flipped_ &&
                        flip_at_ >= sent[i] && flip_at_ < sent[i] + static_cast<uint64_t>(n)) {
                        buf[flip_at_ - sent[i]] ^= 0x01;
                        flipped_ = true;
                    }
                    if (dir == 0) {
                        sent[i] += static_cast<uint64_t>(n);
                    }
                    for (ssize_t off = 0; off < n;) {
                        ssize_t w =
                            ::send(to, buf + off, static_cast<size_t>(n - off), MSG_NOSIGNAL);
                        if (w <= 0) {
                            break;
                        }
                        off += w;
                    }
                }
            }
        }
    }

    uint16_t target_;
    int conn_index_;
    uint64_t flip_at_;
    int listen_ = -1;
    uint16_t port_ = 0;
    std::atomic<bool> stop_{false};
    std::atomic<bool> flipped_{false};
    std::vector<std::pair<int, int>> pairs_;
    std::thread thread_;
};

/// node-a writes 1 MiB to node-b through a proxy that flips one byte inside the chunk data on
/// the first data connection. Returns the write's completion and whether the data arrived as
/// sent.
struct TamperResult {
    std::optional<Event> completion;
    bool arrived = false;
    bool intact = false;
    bool flipped = false;
    /// Chunks node-b's tag workers read from their sockets (chunks_read_by_tag_workers).
    uint64_t read_by_workers = 0;
    /// node-b dropped the session for a chunk that failed its tags (logged while it ran).
    bool session_dropped = false;
};

TamperResult writeThroughTamperingProxy(bool integrity, std::optional<uint32_t> tag_threads = 0) {
    TempDir dir;
    const auto key = dir.writeFile("peer.key", kSecret);
    const uint16_t pa = freePort(), pb = freePort();
    const auto mode = integrity ? config::TcpIntegrity::kMac : config::TcpIntegrity::kNone;
    // Connection 0 is control, 1 the first data connection; byte 100000 is well inside the data.
    TamperingProxy proxy(pb, 1, 100000);
    NodeOptions oa{
        .name = "node-a", .port = pa, .key_file = key, .peers = {{"node-b", proxy.port()}}};
    oa.tweak = [mode, tag_threads](config::Config &c) {
        c.security.tcp_integrity = mode;
        c.tcp.tag_threads = tag_threads;
    };
    NodeOptions ob{.name = "node-b", .port = pb, .key_file = key, .peers = {{"node-a", pa}}};
    ob.tweak = oa.tweak;
    Node a(oa);
    auto b_node = std::make_unique<Node>(ob);
    Node &b = *b_node;
    TamperResult r;
    if (!a.ok() || !b.ok()) {
        return r;
    }
    auto dst = b.addRegion(1u << 20, "recv");
    auto src = a.addRegion(1u << 20);
    fillRandom(src->base, 1u << 20, 77);
    auto [ls, remote] = a.lookup("node-b", "recv");
    if (!ls.isOk()) {
        return r;
    }
    const size_t drops = peerLogCount({"node-a", "authentication tag"});
    auto [ps, op] = a.post("node-b", src, 0, remote.id, 0, 1u << 20, 5);
    if (!ps.isOk()) {
        return r;
    }
    r.completion = a.sink.completion(op, 10s);
    r.arrived = b.sink.count(Event::Kind::kArrived) > 0;
    r.session_dropped = peerLogCount({"node-a", "authentication tag"}) > drops;
    r.read_by_workers = peerStatus(b, "node-a").value("chunks_read_by_tag_workers", uint64_t{0});
    // The write's chunks that verified may still be landing (on node-b's tag workers) when the
    // writer hears the session go: node-b is stopped (its threads joined) before its memory is
    // read.
    b_node.reset();
    r.intact = std::memcmp(dst->base, src->base, 1u << 20) == 0;
    r.flipped = proxy.flipped();
    return r;
}

/// A data byte changed on the way (the chunk's header tag holds): its write fails with the
/// reason, nothing of it is notified, and the session is not dropped for it.
void expectDataChangeCaught(const TamperResult &r) {
    ASSERT_TRUE(r.flipped) << "the proxy did not see the byte it was to change";
    ASSERT_TRUE(r.completion.has_value());
    EXPECT_EQ(r.completion->code, Code::kInvalid) << r.completion->reason;
    EXPECT_NE(r.completion->reason.find("did not match its tag"), std::string::npos)
        << r.completion->reason;
    EXPECT_FALSE(r.arrived) << "the owner was told about data that was changed on the way";
    EXPECT_FALSE(r.session_dropped) << "a data change with good headers dropped the session";
}

TEST(Integrity, AByteChangedOnTheWireIsCaughtAndNeverNotified) {
    expectDataChangeCaught(writeThroughTamperingProxy(true));
}

TEST(Integrity, AByteChangedOnTheWireIsCaughtWithTheTagsOnWorkerThreads) {
    // The same with both ends' chunk tags signed and checked by two workers each. Past the
    // first 64 KiB of each chunk the receiving workers also read the socket, so the changed
    // byte (100,000 bytes into the connection) reaches a worker, not the engine thread.
    TamperResult r = writeThroughTamperingProxy(true, 2);
    expectDataChangeCaught(r);
    EXPECT_GE(r.read_by_workers, 1u) << "no chunk was read by a worker";
}

TEST(Integrity, WithoutTagsTheSameChangeGoesUnnoticed) {
    // The control case: tcp_integrity = "none" on both ends delivers the changed byte.
    TamperResult r = writeThroughTamperingProxy(false);
    ASSERT_TRUE(r.flipped);
    ASSERT_TRUE(r.completion.has_value());
    EXPECT_EQ(r.completion->code, Code::kOk);
    EXPECT_TRUE(r.arrived);
    EXPECT_FALSE(r.intact);
}

/// A TCP relay between a node and its peer, without the key, that changes one byte of the first
/// CHUNK frame whose payload is `payload_bytes` long, on whichever connection carries it (found
/// by its header; handshakes and other frames pass unchanged): the byte `at` bytes from the
/// frame's first byte is XORed with `mask`. Its tag then fails: what matters is whether the
/// target's memory changed before the target found out.
class ChunkRewritingProxy {
public:
    ChunkRewritingProxy(uint16_t target_port, uint32_t payload_bytes, size_t at, uint8_t mask)
        : target_(target_port), at_(at), mask_(mask) {
        // The frame header: magic 0x4C54, type CHUNK, flags 0, the payload length.
        sidecar::encodeFrameHeader(pattern_.data(), FrameType::kChunk, payload_bytes, 0);
        listen_ = listenOnLoopback(&port_);
        thread_ = std::thread([this] { run(); });
    }
    ~ChunkRewritingProxy() {
        stop_ = true;
        thread_.join();
        ::close(listen_);
        for (Pair &p : pairs_) {
            ::close(p.client);
            ::close(p.target);
        }
    }
    uint16_t port() const { return port_; }
    bool changed() const { return changed_.load(); }

private:
    struct Pair {
        int client = -1;
        int target = -1;
        std::vector<uint8_t> seen;      ///< what the client sent so far
        uint64_t edit_at = UINT64_MAX;  ///< the stream position of the byte to change
    };

    /// `n` new client bytes in `buf`, after `p.seen`: finds the frame (its first 8 bytes, which
    /// may straddle reads) and changes its byte once that comes by.
    void inspect(Pair &p, uint8_t *buf, size_t n) {
        const uint64_t old_end = p.seen.size();
        p.seen.insert(p.seen.end(), buf, buf + n);
        if (!found_) {
            const uint64_t from = old_end >= 7 ? old_end - 7 : 0;
            for (uint64_t i = from; i + 8 <= p.seen.size(); ++i) {
                if (std::memcmp(p.seen.data() + i, pattern_.data(), 8) == 0) {
                    found_ = true;
                    p.edit_at = i + at_;
                    break;
                }
            }
        }
        if (p.edit_at >= old_end && p.edit_at < old_end + n) {
            buf[p.edit_at - old_end] ^= mask_;
            changed_ = true;
        }
    }

    void run() {
        while (!stop_) {
            std::vector<pollfd> fds{{listen_, POLLIN, 0}};
            for (Pair &p : pairs_) {
                fds.push_back({p.client, POLLIN, 0});
                fds.push_back({p.target, POLLIN, 0});
            }
            if (::poll(fds.data(), fds.size(), 20) <= 0) {
                continue;
            }
            if (fds[0].revents & POLLIN) {
                Pair p;
                p.client = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
                p.target = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
                sockaddr_in a{};
                a.sin_family = AF_INET;
                a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
                a.sin_port = htons(target_);
                ::connect(p.target, reinterpret_cast<sockaddr *>(&a), sizeof a);
                pairs_.push_back(std::move(p));
            }
            const size_t polled = (fds.size() - 1) / 2;
            for (size_t i = 0; i < polled; ++i) {
                for (int dir = 0; dir < 2; ++dir) {
                    const pollfd &pf = fds[1 + 2 * i + dir];
                    if ((pf.revents & (POLLIN | POLLHUP | POLLERR)) == 0) {
                        continue;
                    }
                    Pair &p = pairs_[i];
                    const int from = dir == 0 ? p.client : p.target;
                    const int to = dir == 0 ? p.target : p.client;
                    uint8_t buf[65536];
                    ssize_t n = ::recv(from, buf, sizeof buf, MSG_DONTWAIT);
                    if (n <= 0) {
                        ::shutdown(to, SHUT_WR);
                        continue;
                    }
                    if (dir == 0) {
                        inspect(p, buf, static_cast<size_t>(n));
                    }
                    for (ssize_t off = 0; off < n;) {
                        ssize_t w =
                            ::send(to, buf + off, static_cast<size_t>(n - off), MSG_NOSIGNAL);
                        if (w <= 0) {
                            break;
                        }
                        off += w;
                    }
                }
            }
        }
    }

    uint16_t target_;
    size_t at_;
    uint8_t mask_;
    std::array<uint8_t, sidecar::kFrameHeaderBytes> pattern_{};
    int listen_ = -1;
    uint16_t port_ = 0;
    bool found_ = false;
    std::atomic<bool> stop_{false};
    std::atomic<bool> changed_{false};
    std::vector<Pair> pairs_;
    std::thread thread_;
};

/// node-a writes 256 KiB (one chunk) to offset 0 of "recv" at node-b, a 1 MiB range at 1 MiB
/// into a 4 MiB host buffer of node-b, through a ChunkRewritingProxy.
struct RewriteResult {
    std::optional<Event> completion;
    size_t arrivals = 0;
    uint64_t arrived_offset = 0;
    bool changed = false;          ///< the proxy changed the byte
    bool untouched = false;        ///< every byte of node-b's 4 MiB buffer is as it was
    bool shifted = false;          ///< the data is at offset 512 KiB of the range instead
    std::string error;             ///< why the write could not be made
    bool session_dropped = false;  ///< node-b dropped the session for a failed chunk
};

// One chunk (cutLength() cuts a 32 KiB write whole), big enough for the tag workers: the proxy
// changes the write's only chunk, so nothing of it may land (a longer write's other chunks,
// genuine and verified, would land, as a failed write's bytes may).
constexpr uint32_t kRewriteLen = 32u << 10;
constexpr uint64_t kRangeAt = 1u << 20;
constexpr uint64_t kShift = 512u << 10;
/// The write_offset field is bytes 24..31 of the frame; its byte 26 XOR 0x08 adds 512 KiB.
constexpr size_t kWriteOffsetByte = sidecar::kFrameHeaderBytes + 8 + 2;
/// A data byte well inside the chunk.
constexpr size_t kDataByte = sidecar::kChunkFrameOverhead + 1000;

RewriteResult writeThroughRewritingProxy(size_t at, uint8_t mask, bool integrity,
                                         std::optional<uint32_t> tag_threads) {
    TempDir dir;
    const auto key = dir.writeFile("peer.key", kSecret);
    const uint16_t pa = freePort(), pb = freePort();
    const auto mode = integrity ? config::TcpIntegrity::kMac : config::TcpIntegrity::kNone;
    // The write goes as chunks of cutLength() over the default connections and chunk size: the
    // proxy changes the first of them.
    const config::TcpConfig tcp_defaults;
    const auto chunk = static_cast<uint32_t>(sidecar::cutLength(
        kRewriteLen, tcp_defaults.connections_per_peer, tcp_defaults.chunk_bytes));
    if (chunk < kRewriteLen) {
        RewriteResult r;
        r.error = "the write goes as more than one chunk: the proxy would change only the first";
        return r;
    }
    ChunkRewritingProxy proxy(pb, static_cast<uint32_t>(sidecar::kChunkHeaderBytes) + chunk, at,
                              mask);
    NodeOptions oa{
        .name = "node-a", .port = pa, .key_file = key, .peers = {{"node-b", proxy.port()}}};
    oa.tweak = [mode, tag_threads](config::Config &c) {
        c.security.tcp_integrity = mode;
        c.tcp.tag_threads = tag_threads;
    };
    NodeOptions ob{.name = "node-b", .port = pb, .key_file = key, .peers = {{"node-a", pa}}};
    ob.tweak = oa.tweak;
    Node a(oa), b(ob);
    RewriteResult r;
    if (!a.ok() || !b.ok()) {
        r.error = "the nodes did not start";
        return r;
    }
    // node-b's buffer (registered, not exposed) and the range of it that is exposed.
    auto buffer = b.addRegion(4u << 20);
    fillRandom(buffer->base, 4u << 20, 31);
    const std::vector<unsigned char> before(buffer->base, buffer->base + (4u << 20));
    auto range = std::make_shared<sidecar::Region>();
    range->base = buffer->base + kRangeAt;
    range->bytes = 1u << 20;
    range->parent = buffer->id;
    range->mapping = buffer->mapping;
    b.call([&] { return b.regions().add(range); });
    b.expose(range, "recv");
    auto src = a.addRegion(kRewriteLen);
    fillRandom(src->base, kRewriteLen, 77);
    auto [ls, remote] = a.lookup("node-b", "recv");
    if (!ls.isOk()) {
        r.error = "lookup: " + ls.message();
        return r;
    }
    const size_t drops = peerLogCount({"node-a", "authentication tag"});
    auto [ps, op] = a.post("node-b", src, 0, remote.id, 0, kRewriteLen, 5);
    if (!ps.isOk()) {
        r.error = "post: " + ps.message();
        return r;
    }
    r.completion = a.sink.completion(op, 10s);
    // Whatever node-b's engine (or a tag worker) still does with the chunk has been done by the
    // time node-a hears the session go; a little more for certainty.
    std::this_thread::sleep_for(100ms);
    r.session_dropped = peerLogCount({"node-a", "authentication tag"}) > drops;
    const auto arrivals = b.sink.arrivals();
    r.arrivals = arrivals.size();
    r.arrived_offset = arrivals.empty() ? 0 : arrivals[0].offset;
    r.changed = proxy.changed();
    r.untouched = std::memcmp(buffer->base, before.data(), before.size()) == 0;
    r.shifted = std::memcmp(range->base + kShift, src->base, kRewriteLen) == 0;
    return r;
}

/// Nothing of the write landed or was notified. A changed header fails the header tag too and
/// drops the session (kPeer); changed data fails only its write (kInvalid).
void expectNothingLanded(const RewriteResult &r, Code code = Code::kPeer) {
    ASSERT_TRUE(r.error.empty()) << r.error;
    ASSERT_TRUE(r.changed) << "the proxy did not see the chunk it was to change";
    ASSERT_TRUE(r.completion.has_value());
    EXPECT_EQ(r.completion->code, code) << r.completion->reason;
    EXPECT_EQ(r.arrivals, 0u) << "the owner was told about a write changed on the way";
    EXPECT_TRUE(r.untouched)
        << "a chunk that fails its tag changed the target's memory before it was checked";
    EXPECT_EQ(r.session_dropped, code == Code::kPeer);
}

TEST(Integrity, ARewrittenWriteOffsetChangesNoByteOfTheTarget) {
    expectNothingLanded(writeThroughRewritingProxy(kWriteOffsetByte, 0x08, true, 0));
}

TEST(Integrity, ARewrittenWriteOffsetChangesNoByteWithTheTagsOnWorkerThreads) {
    expectNothingLanded(writeThroughRewritingProxy(kWriteOffsetByte, 0x08, true, 2));
}

TEST(Integrity, ChangedChunkDataChangesNoByteOfTheTarget) {
    expectNothingLanded(writeThroughRewritingProxy(kDataByte, 0x01, true, 0), Code::kInvalid);
}

TEST(Integrity, ChangedChunkDataChangesNoByteWithTheTagsOnWorkerThreads) {
    expectNothingLanded(writeThroughRewritingProxy(kDataByte, 0x01, true, 2), Code::kInvalid);
}

TEST(Integrity, WithoutTagsARewrittenWriteOffsetMovesTheWrite) {
    // The control case, and what tcp_integrity = "none" offers against such a proxy: nothing.
    // The write lands 512 KiB further into the range, and is notified there.
    RewriteResult r = writeThroughRewritingProxy(kWriteOffsetByte, 0x08, false, 0);
    ASSERT_TRUE(r.error.empty()) << r.error;
    ASSERT_TRUE(r.changed);
    ASSERT_TRUE(r.completion.has_value());
    EXPECT_EQ(r.completion->code, Code::kOk) << r.completion->reason;
    EXPECT_EQ(r.arrivals, 1u);
    EXPECT_EQ(r.arrived_offset, kShift);
    EXPECT_TRUE(r.shifted);
    EXPECT_FALSE(r.untouched);
}

TEST(Integrity, MidSizedWritesAreCutSoTheirStagesOverlap) {
    // Two chunks per connection for a write of a few chunks (at least 32 KiB each, page-rounded),
    // chunk_bytes for big writes, never more than chunk_bytes.
    EXPECT_EQ(sidecar::cutLength(512u << 10, 2, 1u << 20), 128u << 10);  // an NCCL step
    // Beside other writes in flight: chunks of at least 256 KiB (a write no longer goes whole),
    // never more than chunk_bytes, and big writes as alone.
    EXPECT_EQ(sidecar::cutLength(128u << 10, 2, 1u << 20, /*busy=*/true), 256u << 10);
    EXPECT_EQ(sidecar::cutLength(1u << 20, 2, 1u << 20, /*busy=*/true), 256u << 10);
    EXPECT_EQ(sidecar::cutLength(128u << 10, 2, 64u << 10, /*busy=*/true), 64u << 10);
    EXPECT_EQ(sidecar::cutLength(64u << 20, 2, 1u << 20, /*busy=*/true), 1u << 20);
    EXPECT_EQ(sidecar::cutLength(1u << 20, 2, 1u << 20), 256u << 10);
    EXPECT_EQ(sidecar::cutLength(4u << 20, 2, 1u << 20), 1u << 20);
    EXPECT_EQ(sidecar::cutLength(64u << 20, 4, 1u << 20), 1u << 20);
    EXPECT_EQ(sidecar::cutLength(128u << 10, 2, 1u << 20), 32u << 10);
    EXPECT_EQ(sidecar::cutLength(64u << 10, 2, 1u << 20), 32u << 10);
    EXPECT_EQ(sidecar::cutLength(100, 2, 1u << 20), 32u << 10);   // (then what is left: 100)
    EXPECT_EQ(sidecar::cutLength(300000, 1, 1u << 20), 151552u);  // 150000 up to a page
    EXPECT_EQ(sidecar::cutLength(512u << 10, 2, 16u << 10), 16u << 10);
}

TEST(Integrity, BothEndsMustAgree) {
    TempDir dir;
    const auto key = dir.writeFile("peer.key", kSecret);
    const uint16_t pa = freePort(), pb = freePort();
    NodeOptions oa{.name = "node-a", .port = pa, .key_file = key, .peers = {{"node-b", pb}}};
    oa.tweak = [](config::Config &c) { c.security.tcp_integrity = config::TcpIntegrity::kNone; };
    NodeOptions ob{.name = "node-b", .port = pb, .key_file = key, .peers = {{"node-a", pa}}};
    Node a(oa), b(ob);
    ASSERT_TRUE(a.ok() && b.ok());
    b.addRegion(4096, "recv");
    auto [s, rr] = a.lookup("node-b", "recv", 5s);
    EXPECT_EQ(s.code(), Code::kPeer) << s.message();
    EXPECT_TRUE(peerLogHas({"tcp_integrity differs", "\"none\"", "\"mac\""}));
}

}  // namespace
}  // namespace tensorlane::peertest
