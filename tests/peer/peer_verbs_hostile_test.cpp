// An authenticated peer that bootstraps a verbs session correctly and then posts what a real
// sender never would: a descriptor that claims bytes past its region, and a write outside the
// memory its key covers. The receiving node refuses that session alone: nothing is notified for
// it, and its other peers' writes go on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "harness.hpp"
#include "raw_peer.hpp"
#include "raw_verbs.hpp"
#include "transport/set.hpp"
#include "transport/verbs/wire.hpp"

namespace tensorlane::peertest {
namespace {

using sidecar::FrameHeader;
using sidecar::FrameType;
using sidecar::RegionKey;
using sidecar::VerbsBlob;
using sidecar::VerbsMsg;
using sidecar::WireImm;
using sidecar::WriteDescriptor;

const std::string kVerbsKey = keyText('8');

size_t arrivalsFrom(Node &n, const std::string &peer, uint32_t imm) {
    const auto ev = n.sink.arrivals();
    return static_cast<size_t>(std::count_if(
        ev.begin(), ev.end(), [&](const Event &e) { return e.peer_name == peer && e.imm == imm; }));
}

/// Whether `n` was notified `count` times of writes from `peer` with `imm` within 5 s.
bool arrivedWithin(Node &n, const std::string &peer, uint32_t imm, size_t count) {
    return n.sink.waitFor(
        [&](const std::vector<Event> &ev) {
            return static_cast<size_t>(std::count_if(ev.begin(), ev.end(), [&](const Event &e) {
                       return e.kind == Event::Kind::kArrived && e.peer_name == peer &&
                              e.imm == imm;
                   })) == count;
        },
        5s);
}

class HostileVerbsPeer : public ::testing::Test {
protected:
    void SetUp() override {
        if (!simulatedHcaLoaded()) {
            GTEST_SKIP() << "needs the simulated HCA (LD_LIBRARY_PATH at tests/simhca; CTest "
                            "sets it)";
        }
        key_ = dir_.writeFile("peer.key", kVerbsKey);
        const uint16_t port_a = freePort(), port_b = freePort();
        NodeOptions ob;
        ob.name = "node-b";
        ob.port = port_b;
        ob.key_file = key_;
        ob.transport = "verbs";
        ob.peers = {{"node-a", port_a}, {"node-evil", freePort()}};
        const config::GdrFlush flush = flushMode();
        ob.tweak = [flush](config::Config &c) {
            c.fabric.gdr_flush = flush;
            c.security.revoke_timeout_ms = kRevokeTimeoutMs;
        };
        b_ = std::make_unique<Node>(ob);
        NodeOptions oa;
        oa.name = "node-a";
        oa.port = port_a;
        oa.key_file = key_;
        oa.transport = "verbs";
        oa.peers = {{"node-b", port_b}};
        oa.tweak = ob.tweak;
        a_ = std::make_unique<Node>(oa);
        ASSERT_TRUE(b_->ok() && a_->ok());
        dst_ = b_->addRegion(kRegion, "recv");
        src_ = a_->addRegion(kRegion);
        fillRandom(src_->base, kRegion, 3);
    }

    virtual config::GdrFlush flushMode() const { return config::GdrFlush::kAuto; }

    /// node-b's GDR flush count for node-a's writes (its status).
    uint64_t flushesAtB() {
        auto j = nlohmann::json::parse(b_->statusJson());
        for (auto &p : j["peers"]) {
            if (p.value("name", "") == "node-a" && p.contains("receive")) {
                return p["receive"].value("gdr_flushes", uint64_t{0});
            }
        }
        return 0;
    }

    /// node-a's write of the whole region to node-b's, with `imm`: ends kOk and is notified.
    void honestWriteWorks(uint32_t imm) {
        auto [ls, remote] = a_->lookup("node-b", "recv");
        ASSERT_TRUE(ls.isOk()) << ls.message();
        auto [ps, op] = a_->post("node-b", src_, 0, remote.id, 0, kRegion, imm);
        ASSERT_TRUE(ps.isOk()) << ps.message();
        auto c = a_->sink.completion(op, 10s);
        ASSERT_TRUE(c.has_value());
        ASSERT_EQ(c->code, Code::kOk) << c->reason;
        EXPECT_TRUE(arrivedWithin(*b_, "node-a", imm, 1));
        EXPECT_EQ(0, std::memcmp(dst_->base, src_->base, kRegion));
    }

    /// node-b's status of peer `peer` (an empty object when it has none).
    nlohmann::json peerStatusAtB(const std::string &peer) {
        auto j = nlohmann::json::parse(b_->statusJson());
        for (auto &p : j["peers"]) {
            if (p.value("name", "") == peer) {
                return p;
            }
        }
        return nlohmann::json::object();
    }

    /// A range of a node-b host buffer, exposed as `name` alone: kRegion bytes at kRegion into a
    /// buffer of 3 * kRegion (what a caching allocator makes of one tensor in its block).
    std::shared_ptr<Region> exposeRange(const std::string &name, std::shared_ptr<Region> *buffer) {
        *buffer = b_->addRegion(3 * kRegion);
        fillRandom((*buffer)->base, 3 * kRegion, 77);
        auto range = std::make_shared<Region>();
        range->owner = (*buffer)->owner;
        range->parent = (*buffer)->id;
        range->base = (*buffer)->base + kRegion;
        range->bytes = kRegion;
        range->mapping = (*buffer)->mapping;
        b_->call([&] { return b_->regions().add(range); });
        b_->expose(range, name);
        return range;
    }

    /// The raw peer's session to node-b over verbs, and node-b's key for "recv" (or for the
    /// region `region`).
    void openEvil(RawVerbsEnd *end, std::unique_ptr<RawClientPeer> *evil, RegionKey *key,
                  RegionId region = 0) {
        if (region == 0) {
            region = dst_->id;
        }
        std::string why;
        ASSERT_TRUE(end->open(nextSimDevice(), 2, &why)) << why;
        RawCaps caps;
        caps.transports = sidecar::kTransportTcp | sidecar::kTransportVerbs;
        *evil = std::make_unique<RawClientPeer>(kVerbsKey, "node-evil", "node-b", b_->port(), caps);
        std::vector<uint8_t> selected;
        const auto blob = sidecar::encodeVerbsBlob(end->blob());
        ASSERT_TRUE((*evil)->openSession(sidecar::kTransportVerbs, blob, &selected, &why)) << why;
        VerbsBlob receiver;
        ASSERT_TRUE(sidecar::decodeVerbsBlob(selected, &receiver, &why)) << why;
        ASSERT_TRUE(end->connect(receiver, &why)) << why;
        // The verbs channel: the keys come there, not on the control connection.
        ASSERT_TRUE((*evil)->openData(0, &why)) << why;
        FrameHeader h;
        std::vector<uint8_t> p;
        for (;;) {
            ASSERT_TRUE((*evil)->data(0).recv(&h, &p)) << "no KEY_ADD from node-b";
            if (h.type == FrameType::kTransport &&
                sidecar::verbsMsgOf(h.arg) == static_cast<uint32_t>(VerbsMsg::kKeyAdd)) {
                ASSERT_TRUE(sidecar::decodeRegionKey(p, key));
                if (key->region == region) {
                    break;
                }
            }
        }
        EXPECT_EQ(key->bytes, kRegion);
    }

    static WriteDescriptor descriptor(uint64_t seq, uint64_t region, uint64_t offset,
                                      uint64_t bytes, uint32_t imm) {
        WriteDescriptor d;
        d.seq = seq;
        d.region = region;
        d.offset = offset;
        d.bytes = bytes;
        d.imm = imm;
        d.stripes = 1;
        d.check = sidecar::descriptorCheck(d);
        return d;
    }

    /// A raw-verbs write to node-b of 4 KiB, notified as `imm`, whose descriptor names the
    /// range's last 4 KiB but whose data goes `shift` bytes from the range's first byte (the
    /// same allocation, outside the range): the HCA must refuse it, nothing outside the range
    /// may change and nobody is told.
    void shiftedWriteIsRefused(int64_t shift, uint32_t imm) {
        std::shared_ptr<Region> buffer;
        auto range = exposeRange("kv", &buffer);
        RawVerbsEnd end;
        std::unique_ptr<RawClientPeer> evil;
        RegionKey key;
        openEvil(&end, &evil, &key, range->id);
        if (HasFatalFailure()) {
            return;
        }
        EXPECT_EQ(key.bytes, kRegion);
        // An honest write into the range first: its key works for the range's own bytes.
        ASSERT_TRUE(end.postDescriptor(0, descriptor(1, key.region, 0, 4096, imm - 1)));
        ASSERT_TRUE(end.postData(0, key.addr, key.rkey, 4096, WireImm::encode(1, 1)));
        EXPECT_EQ(end.nextCompletion(5000), IBV_WC_SUCCESS);
        EXPECT_EQ(end.nextCompletion(5000), IBV_WC_SUCCESS);
        ASSERT_TRUE(arrivedWithin(*b_, "node-evil", imm - 1, 1));
        const std::vector<uint8_t> before(buffer->base, buffer->base + 3 * kRegion);

        ASSERT_TRUE(end.postDescriptor(0, descriptor(2, key.region, kRegion - 4096, 4096, imm)));
        ASSERT_TRUE(end.postData(0, key.addr + static_cast<uint64_t>(shift), key.rkey, 4096,
                                 WireImm::encode(2, 1)));
        int last = IBV_WC_SUCCESS;
        for (int i = 0; i < 2 && last == IBV_WC_SUCCESS; ++i) {
            last = end.nextCompletion(5000);
        }
        EXPECT_EQ(last, IBV_WC_REM_ACCESS_ERR)
            << "the HCA let a write " << shift << " bytes from the range's start through: "
            << ibv_wc_status_str(static_cast<ibv_wc_status>(last));
        EXPECT_TRUE(evil->control().closedWithin(5000)) << "node-b kept the session";
        std::this_thread::sleep_for(200ms);
        EXPECT_EQ(0, std::memcmp(buffer->base, before.data(), before.size()))
            << "bytes of the allocation outside the exposed range changed";
        EXPECT_EQ(arrivalsFrom(*b_, "node-evil", imm), 0u) << "the shifted write was notified";

        // node-a's writes to the range itself still land, and only there.
        auto [ls, remote] = a_->lookup("node-b", "kv");
        ASSERT_TRUE(ls.isOk()) << ls.message();
        auto [ps, op] = a_->post("node-b", src_, 0, remote.id, 0, kRegion, imm + 1);
        ASSERT_TRUE(ps.isOk()) << ps.message();
        auto c = a_->sink.completion(op, 10s);
        ASSERT_TRUE(c.has_value());
        ASSERT_EQ(c->code, Code::kOk) << c->reason;
        EXPECT_TRUE(arrivedWithin(*b_, "node-a", imm + 1, 1));
        EXPECT_EQ(0, std::memcmp(range->base, src_->base, kRegion));
        EXPECT_EQ(0, std::memcmp(buffer->base, before.data(), kRegion));
        EXPECT_EQ(0, std::memcmp(buffer->base + 2 * kRegion, before.data() + 2 * kRegion, kRegion));
    }

    static constexpr size_t kRegion = 256u << 10;
    static constexpr uint32_t kRevokeTimeoutMs = 300;
    TempDir dir_;
    std::string key_;
    std::unique_ptr<Node> b_, a_;
    std::shared_ptr<Region> dst_, src_;
};

TEST_F(HostileVerbsPeer, ForgedDescriptorPastTheRegionIsRefusedAndOthersGoOn) {
    honestWriteWorks(11);
    RawVerbsEnd end;
    std::unique_ptr<RawClientPeer> evil;
    RegionKey key;
    openEvil(&end, &evil, &key);
    if (HasFatalFailure()) {
        return;
    }
    // An honest write first, by hand: 4 KiB at offset 0 with its descriptor, notified with the
    // peer's immediate (so what follows is refused for its lie alone).
    ASSERT_TRUE(end.postDescriptor(0, descriptor(1, key.region, 0, 4096, 5)));
    ASSERT_TRUE(end.postData(0, key.addr, key.rkey, 4096, WireImm::encode(1, 1)));
    EXPECT_EQ(end.nextCompletion(5000), IBV_WC_SUCCESS);
    EXPECT_EQ(end.nextCompletion(5000), IBV_WC_SUCCESS);
    ASSERT_TRUE(arrivedWithin(*b_, "node-evil", 5, 1));
    EXPECT_EQ(0, std::memcmp(dst_->base, std::vector<uint8_t>(4096, 0x6b).data(), 4096));

    // The lie: 64 bytes placed inside the key's memory (the HCA allows it), a descriptor that
    // claims 4096 bytes from 64 before the region's end.
    ASSERT_TRUE(end.postDescriptor(1, descriptor(2, key.region, kRegion - 64, 4096, 6)));
    ASSERT_TRUE(end.postData(1, key.addr + kRegion - 64, key.rkey, 64, WireImm::encode(2, 1)));
    EXPECT_TRUE(evil->control().closedWithin(5000)) << "node-b kept the session";
    EXPECT_TRUE(peerLogHas({"node-evil", "past region"}));
    std::this_thread::sleep_for(200ms);
    EXPECT_EQ(arrivalsFrom(*b_, "node-evil", 6), 0u) << "a forged write was notified";

    // node-a's session is untouched.
    fillRandom(src_->base, kRegion, 4);
    honestWriteWorks(12);
}

TEST_F(HostileVerbsPeer, WriteOutsideTheKeyEndsOnlyThatSession) {
    honestWriteWorks(21);
    RawVerbsEnd end;
    std::unique_ptr<RawClientPeer> evil;
    RegionKey key;
    openEvil(&end, &evil, &key);
    if (HasFatalFailure()) {
        return;
    }
    // 4 KiB a mebibyte past the region: outside every MR of node-b's protection domain for this
    // peer. The responder refuses it (remote access error) and nothing lands.
    ASSERT_TRUE(end.postDescriptor(0, descriptor(1, key.region, 0, 4096, 7)));
    ASSERT_TRUE(
        end.postData(0, key.addr + kRegion + (1u << 20), key.rkey, 4096, WireImm::encode(1, 1)));
    int last = IBV_WC_SUCCESS;
    for (int i = 0; i < 2 && last == IBV_WC_SUCCESS; ++i) {
        last = end.nextCompletion(5000);
    }
    EXPECT_EQ(last, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(static_cast<ibv_wc_status>(last));
    EXPECT_TRUE(evil->control().closedWithin(5000)) << "node-b kept the session";
    EXPECT_EQ(arrivalsFrom(*b_, "node-evil", 7), 0u);
    fillRandom(src_->base, kRegion, 5);
    honestWriteWorks(22);
}

// The key a peer gets for a range of a buffer covers that range alone: a write shifted past its
// end, or before its start, into the same allocation is refused by the HCA itself.
TEST_F(HostileVerbsPeer, WriteShiftedPastAnExposedRangeIsRefusedByTheHca) {
    shiftedWriteIsRefused(static_cast<int64_t>(kRegion), 30);
}

TEST_F(HostileVerbsPeer, WriteShiftedBeforeAnExposedRangeIsRefusedByTheHca) {
    shiftedWriteIsRefused(-4096, 34);
}

TEST_F(HostileVerbsPeer, WriteStraddlingAnExposedRangesEndIsRefusedByTheHca) {
    shiftedWriteIsRefused(static_cast<int64_t>(kRegion) - 64, 38);
}

// A peer that never confirms a revocation (KEY_DEL, no KEY_DEL_DONE) and keeps writing: after
// [security] revoke_timeout_ms the region's MR is gone, so its write fails on the HCA and the
// memory its owner took back is never written. node-a, which confirms, is not forced.
TEST_F(HostileVerbsPeer, UnconfirmedRevocationIsForcedAfterTheDeadline) {
    honestWriteWorks(50);
    RawVerbsEnd end;
    std::unique_ptr<RawClientPeer> evil;
    RegionKey key;
    openEvil(&end, &evil, &key);
    if (HasFatalFailure()) {
        return;
    }
    ASSERT_TRUE(end.postDescriptor(0, descriptor(1, key.region, 0, 4096, 51)));
    ASSERT_TRUE(end.postData(0, key.addr, key.rkey, 4096, WireImm::encode(1, 1)));
    EXPECT_EQ(end.nextCompletion(5000), IBV_WC_SUCCESS);
    EXPECT_EQ(end.nextCompletion(5000), IBV_WC_SUCCESS);
    ASSERT_TRUE(arrivedWithin(*b_, "node-evil", 51, 1));

    b_->revoke(dst_->id);
    FrameHeader h;
    std::vector<uint8_t> p;
    bool asked = false;
    while (!asked && evil->data(0).recv(&h, &p, 5000)) {
        uint64_t id = 0;
        asked = h.type == FrameType::kTransport &&
                sidecar::verbsMsgOf(h.arg) == static_cast<uint32_t>(VerbsMsg::kKeyDel) &&
                sidecar::decodeU64(p, &id) && id == dst_->id;
    }
    ASSERT_TRUE(asked) << "node-b never sent KEY_DEL";
    // No KEY_DEL_DONE. Past the deadline (and the engine's idle tick) the owner reuses the
    // memory; the peer writes with its old key.
    std::this_thread::sleep_for(std::chrono::milliseconds(kRevokeTimeoutMs * 3 + 300));
    // Counted per peer (node-a, which confirmed in time, is not).
    EXPECT_EQ(peerStatusAtB("node-evil").value("revocations_forced", uint64_t{0}), 1u);
    const auto honest = peerStatusAtB("node-a");
    EXPECT_EQ(honest.value("revocations_forced", uint64_t{99}), 0u);
    ASSERT_TRUE(honest.contains("receive"));
    EXPECT_EQ(honest["receive"].value("revoking", uint64_t{99}), 0u);
    fillRandom(dst_->base, kRegion, 99);
    const std::vector<uint8_t> reused(dst_->base, dst_->base + kRegion);
    ASSERT_TRUE(end.postDescriptor(0, descriptor(2, key.region, 0, 4096, 52)));
    ASSERT_TRUE(end.postData(0, key.addr, key.rkey, 4096, WireImm::encode(2, 1)));
    int last = IBV_WC_SUCCESS;
    for (int i = 0; i < 2 && last == IBV_WC_SUCCESS; ++i) {
        last = end.nextCompletion(5000);
    }
    EXPECT_EQ(last, IBV_WC_REM_ACCESS_ERR) << "a write with a revoked key went through: "
                                           << ibv_wc_status_str(static_cast<ibv_wc_status>(last));
    std::this_thread::sleep_for(200ms);
    EXPECT_EQ(0, std::memcmp(dst_->base, reused.data(), kRegion))
        << "memory reused after the revocation deadline was written";
    EXPECT_EQ(arrivalsFrom(*b_, "node-evil", 52), 0u);
    EXPECT_TRUE(evil->control().closedWithin(5000)) << "node-b kept the session";
}

// [fabric] gdr_flush = "on": every notification waits for a flush READ on the receiver's
// loopback QP pair (host memory here; GPU memory is what it is for). The READ needs remote read
// on the region's MR, but the peer's own QPs still allow writes only: its READ is refused.
class HostileVerbsPeerWithFlush : public HostileVerbsPeer {
protected:
    config::GdrFlush flushMode() const override { return config::GdrFlush::kOn; }
};

TEST_F(HostileVerbsPeerWithFlush, WritesAreFlushedBeforeNoticeAndThePeerCannotRead) {
    for (uint32_t i = 0; i < 8; ++i) {
        fillRandom(src_->base, kRegion, 40 + i);
        honestWriteWorks(40 + i);
    }
    EXPECT_GE(flushesAtB(), 1u);
    EXPECT_LE(flushesAtB(), 8u);  // one READ covers every write complete by then
    RawVerbsEnd end;
    std::unique_ptr<RawClientPeer> evil;
    RegionKey key;
    openEvil(&end, &evil, &key);
    if (HasFatalFailure()) {
        return;
    }
    ASSERT_TRUE(end.postRead(0, key.addr, key.rkey, 64));
    const int st = end.nextCompletion(5000);
    EXPECT_TRUE(st == IBV_WC_REM_ACCESS_ERR || st == IBV_WC_REM_INV_REQ_ERR)
        << ibv_wc_status_str(static_cast<ibv_wc_status>(st));
    EXPECT_TRUE(evil->control().closedWithin(5000));
    fillRandom(src_->base, kRegion, 60);
    honestWriteWorks(60);
}

// Descriptors whose check word is right (a peer can compute it) and whose fields break the
// protocol: a message of a bad length, unknown flags, a silent message, a message with data or
// whose bytes fail their check, a write with message bytes. Each ends that peer's session with
// the reason in the log; nothing of it is delivered, nothing is read past the ring's slot, and
// node-a's session goes on.
struct BadDescriptor {
    const char *name;
    uint32_t flags;
    uint32_t message_bytes;
    uint64_t bytes;      ///< a write's (its data follows the descriptor)
    bool torn_message;   ///< the message's bytes changed after their check was computed
    const char *reason;  ///< in node-b's log
};

void PrintTo(const BadDescriptor &c, std::ostream *os) {
    *os << c.name;
}

class HostileVerbsDescriptor : public HostileVerbsPeer,
                               public ::testing::WithParamInterface<BadDescriptor> {};

TEST_P(HostileVerbsDescriptor, EndsOnlyThatSessionAndIsNeverDelivered) {
    const BadDescriptor &c = GetParam();
    RawVerbsEnd end;
    std::unique_ptr<RawClientPeer> evil;
    RegionKey key;
    openEvil(&end, &evil, &key);
    if (HasFatalFailure()) {
        return;
    }
    // An honest message first, by hand: the header and its bytes in one WRITE_WITH_IMM into the
    // ring, reported with messageArrived (so what follows is refused for its lie alone).
    WriteDescriptor m = descriptor(1, key.region, 100, 0, 90);
    m.flags = sidecar::kDescMessage;
    m.message_bytes = 16;
    for (uint32_t i = 0; i < m.message_bytes; ++i) {
        m.message[i] = static_cast<uint8_t>(0xa0 + i);
    }
    m.message_check = sidecar::messageCheck(m.seq, m.message, m.message_bytes);
    m.check = sidecar::descriptorCheck(m);
    ASSERT_TRUE(end.postMessage(0, m, WireImm::encode(1, 1)));
    EXPECT_EQ(end.nextCompletion(5000), IBV_WC_SUCCESS);
    ASSERT_TRUE(b_->sink.waitFor(
        [](const std::vector<Event> &ev) {
            return std::any_of(ev.begin(), ev.end(), [](const Event &e) {
                return e.kind == Event::Kind::kMessage && e.peer_name == "node-evil" && e.imm == 90;
            });
        },
        5s));
    for (const Event &e : b_->sink.deliveries()) {
        if (e.peer_name == "node-evil") {
            EXPECT_EQ(e.offset, 100u);
            EXPECT_EQ(e.message, std::vector<uint8_t>(m.message, m.message + 16));
        }
    }

    WriteDescriptor d = descriptor(2, key.region, 0, c.bytes, 91);
    d.flags = c.flags;
    d.message_bytes = c.message_bytes;
    std::memset(d.message, 0x5a, sizeof d.message);
    d.message_check = sidecar::messageCheck(d.seq, d.message,
                                            std::min<size_t>(c.message_bytes, sizeof d.message));
    if (c.torn_message) {
        d.message[3] ^= 1;
    }
    d.check = sidecar::descriptorCheck(d);
    if (c.bytes == 0) {
        ASSERT_TRUE(end.postMessage(1, d, WireImm::encode(2, 1)));
    } else {
        ASSERT_TRUE(end.postDescriptor(1, d));
        ASSERT_TRUE(end.postData(1, key.addr, key.rkey, static_cast<uint32_t>(c.bytes),
                                 WireImm::encode(2, 1)));
    }
    EXPECT_TRUE(evil->control().closedWithin(5000)) << "node-b kept the session";
    EXPECT_TRUE(peerLogHas({"node-evil", c.reason})) << c.reason;
    std::this_thread::sleep_for(200ms);
    for (const Event &e : b_->sink.deliveries()) {
        EXPECT_FALSE(e.peer_name == "node-evil" && e.imm == 91) << "a bad descriptor was delivered";
    }
    honestWriteWorks(92);
}

INSTANTIATE_TEST_SUITE_P(
    Fields, HostileVerbsDescriptor,
    ::testing::Values(
        BadDescriptor{"MessageOf513Bytes", sidecar::kDescMessage, 513, 0, false,
                      "claims a message of 513 bytes"},
        BadDescriptor{"MessageOf4GiB", sidecar::kDescMessage, 0xffffffffu, 0, false,
                      "claims a message of 4294967295 bytes"},
        BadDescriptor{"EmptyMessage", sidecar::kDescMessage, 0, 0, false,
                      "claims a message of 0 bytes"},
        BadDescriptor{"UnknownFlagOnAWrite", 1u << 2, 0, 4096, false, "unknown flags 0x4"},
        BadDescriptor{"UnknownHighFlagOnAMessage", sidecar::kDescMessage | 0x80000000u, 8, 0, false,
                      "unknown flags 0x80000000"},
        BadDescriptor{"SilentMessage", sidecar::kDescMessage | sidecar::kDescSilent, 8, 0, false,
                      "is a message and silent"},
        BadDescriptor{"MessageWithData", sidecar::kDescMessage, 8, 4096, false,
                      "is a message with 4096 data bytes"},
        BadDescriptor{"TornMessage", sidecar::kDescMessage, 64, 0, true, "fails its check"},
        BadDescriptor{"WriteWithMessageBytes", 0, 8, 4096, false,
                      "carries message bytes but is no message"}),
    [](const ::testing::TestParamInfo<BadDescriptor> &i) { return std::string(i.param.name); });

class FlushOff : public HostileVerbsPeer {
protected:
    config::GdrFlush flushMode() const override { return config::GdrFlush::kOff; }
};

TEST_F(FlushOff, HostMemoryUnderAutoOrOffIsNeverFlushed) {
    honestWriteWorks(70);
    honestWriteWorks(71);
    EXPECT_EQ(flushesAtB(), 0u);
}

}  // namespace
}  // namespace tensorlane::peertest
