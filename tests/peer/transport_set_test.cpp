// The engine's TransportSet: routing by caps, binding peers, and the one message a write to an
// unbound peer gets; and the registry's checks of [fabric] transports.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "tensorlane/config/config.hpp"
#include "transport/set.hpp"

namespace tensorlane::sidecar {
namespace {

/// A transport that records what it was asked.
class FakeTransport final : public Transport {
public:
    FakeTransport(const char *name, TransportCaps caps) : name_(name), caps_(caps) {}
    const char *name() const override { return name_; }
    TransportCaps caps() const override { return caps_; }
    Status registerRegion(Region &r) override {
        registered.push_back(r.id);
        return fail_register ? Status{Code::kNoMemory, name_} : Status::ok();
    }
    void deregisterRegion(RegionId r) override { deregistered.push_back(r); }
    Status post(const WriteOp &op) override {
        posted.push_back(op.op_id);
        return Status::ok();
    }
    size_t progress(EventSink &) override { return 0; }

    std::vector<uint64_t> posted;
    std::vector<RegionId> registered;
    std::vector<RegionId> deregistered;
    bool fail_register = false;

private:
    const char *name_;
    TransportCaps caps_;
};

TransportCaps localCaps() {
    TransportCaps c;
    c.local = true;
    return c;
}

TransportCaps remoteCaps(uint32_t wire) {
    TransportCaps c;
    c.remote = true;
    c.wire_id = wire;
    return c;
}

WriteOp opTo(PeerId peer, uint64_t id) {
    WriteOp op;
    op.peer = peer;
    op.op_id = id;
    return op;
}

TEST(TransportSet, RoutesLocalWritesToTheLocalOneAndRemoteOnesToTheBoundOne) {
    TransportSet set;
    auto local = std::make_unique<FakeTransport>("local", localCaps());
    auto verbs = std::make_unique<FakeTransport>("verbs", remoteCaps(kTransportVerbs));
    auto tcp = std::make_unique<FakeTransport>("tcp", remoteCaps(kTransportTcp));
    FakeTransport *l = local.get(), *v = verbs.get(), *t = tcp.get();
    set.add(std::move(local));
    set.add(std::move(verbs));
    set.add(std::move(tcp));
    ASSERT_EQ(set.all().size(), 3u);
    EXPECT_EQ(set.local(), l);
    ASSERT_EQ(set.remote().size(), 2u);
    EXPECT_EQ(set.remote()[0], v) << "the preference order is the order added";
    EXPECT_EQ(set.byWireId(kTransportTcp), t);
    EXPECT_EQ(set.byWireId(1u << 7), nullptr);

    EXPECT_TRUE(set.post(opTo(kLocalPeer, 1)).isOk());
    set.unbind(2, "peer 'node-c' is down: not connected");
    set.bind(1, t);
    EXPECT_TRUE(set.post(opTo(1, 2)).isOk());
    const Status down = set.post(opTo(2, 3));
    EXPECT_EQ(down.code(), Code::kPeer);
    EXPECT_EQ(down.message(), "peer 'node-c' is down: not connected");
    EXPECT_EQ(set.post(opTo(9, 4)).code(), Code::kPeer) << "a peer never named";
    EXPECT_EQ(l->posted, std::vector<uint64_t>{1});
    EXPECT_EQ(t->posted, std::vector<uint64_t>{2});
    EXPECT_TRUE(v->posted.empty());

    set.unbind(1, "peer 'node-b' is down: lost");
    EXPECT_EQ(set.boundTo(1), nullptr);
    EXPECT_EQ(set.post(opTo(1, 5)).message(), "peer 'node-b' is down: lost");
    EXPECT_EQ(t->posted.size(), 1u) << "an unbound peer's write reached its old transport";
}

TEST(TransportSet, RegistersWithEveryTransportAndStopsAtTheFirstError) {
    TransportSet set;
    auto a = std::make_unique<FakeTransport>("local", localCaps());
    auto b = std::make_unique<FakeTransport>("tcp", remoteCaps(kTransportTcp));
    FakeTransport *pa = a.get(), *pb = b.get();
    set.add(std::move(a));
    set.add(std::move(b));
    Region r;
    r.id = 7;
    EXPECT_TRUE(set.registerRegion(r).isOk());
    EXPECT_EQ(pa->registered, std::vector<RegionId>{7});
    EXPECT_EQ(pb->registered, std::vector<RegionId>{7});
    pa->fail_register = true;
    r.id = 8;
    EXPECT_EQ(set.registerRegion(r).code(), Code::kNoMemory);
    EXPECT_EQ(pb->registered.size(), 1u);
    set.deregisterRegion(8);
    EXPECT_EQ(pa->deregistered, std::vector<RegionId>{8});
    EXPECT_EQ(pb->deregistered, std::vector<RegionId>{8});
}

TEST(TransportRegistry, NoRemoteTransportWithoutPeersAndAnErrorWhenNoneCanStart) {
    config::Config cfg;
    RegionTable regions;
    TransportSet none;
    ASSERT_TRUE(addRemoteTransports(cfg, regions, &none).isOk());
    EXPECT_TRUE(none.remote().empty()) << "a node without [[peers]] opens no transport";

    config::PeerConfig peer;
    peer.name = "node-b";
    peer.address = config::Endpoint{"127.0.0.1", 1};
    cfg.peers.push_back(peer);
    TransportSet tcp;
    cfg.fabric.transports = {"tcp"};
    ASSERT_TRUE(addRemoteTransports(cfg, regions, &tcp).isOk());
    ASSERT_EQ(tcp.remote().size(), 1u);
    EXPECT_STREQ(tcp.remote()[0]->name(), "tcp");

    // verbs alone on a host whose sysfs has no RDMA device: refused, naming the list.
    TransportSet verbs;
    cfg.fabric.transports = {"verbs"};
    cfg.fabric.transport = config::TransportKind::kVerbs;
    ::setenv("TENSORLANE_SYSFS_ROOT", "/nonexistent-sysfs", 1);
    const Status s = addRemoteTransports(cfg, regions, &verbs);
    ::unsetenv("TENSORLANE_SYSFS_ROOT");
    EXPECT_FALSE(s.isOk());
    EXPECT_NE(s.message().find("[fabric] transports"), std::string::npos) << s.message();
    EXPECT_TRUE(verbs.remote().empty());
}

}  // namespace
}  // namespace tensorlane::sidecar
