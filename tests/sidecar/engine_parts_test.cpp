// The engine's parts on their own, without the loop or a socket (engine_impl.hpp): Admission's
// credential check and session caps, RegionLifecycle's quotas and retirement, and the
// RequestPipeline's per-peer queues, the end of every accepted write, and the writer's uid in a
// local arrival. A fake transport stands in for the real ones; sessions have real segments, and
// the test plays the client on their rings.
#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "admission.hpp"
#include "engine_counters.hpp"
#include "metrics/write_stats.hpp"
#include "region_lifecycle.hpp"
#include "request_pipeline.hpp"
#include "session_table.hpp"
#include "tensorlane/ipc/layout.hpp"
#include "tensorlane/ipc/shm.hpp"
#include "transport/set.hpp"

namespace tensorlane::sidecar {
namespace {

/// A local transport that records what it was asked; full: post() says kAgain.
class FakeTransport final : public Transport {
public:
    const char *name() const override { return "fake"; }
    TransportCaps caps() const override {
        TransportCaps c;
        c.local = true;
        return c;
    }
    Status registerRegion(Region &r) override {
        registered.push_back(r.id);
        if (refuse_registration) {
            return {Code::kNoMemory, "no room for it"};
        }
        return Status::ok();
    }
    void deregisterRegion(RegionId r) override { deregistered.push_back(r); }
    Status post(const WriteOp &op) override {
        ++attempts;
        if (full) {
            return {Code::kAgain, "full"};
        }
        posted.push_back(op.op_id);
        return Status::ok();
    }
    size_t progress(EventSink &) override { return 0; }

    bool full = false;
    bool refuse_registration = false;
    size_t attempts = 0;
    std::vector<uint64_t> posted;
    std::vector<RegionId> registered;
    std::vector<RegionId> deregistered;
};

constexpr uint32_t kDepth = 64;

/// A session as the control server sets one up (its segment and rings), with the client's
/// ends of the rings.
struct Client {
    Session *s = nullptr;
    ipc::RingProducer<ipc::Request> requests;
    ipc::RingConsumer<ipc::Completion> completions;
    ipc::RingConsumer<ipc::Notification> notifications;
    uint64_t next_ticket = 1;

    /// Publishes one write of `bytes` from `src` to the handle `dst`; returns its ticket.
    uint64_t write(RegionId src, uint64_t dst, uint64_t bytes, uint32_t imm = 0) {
        ipc::Request r{};
        r.op = static_cast<uint8_t>(ipc::Op::kWrite);
        r.imm = imm;
        r.ticket = next_ticket++;
        r.src_region = src;
        r.dst_remote = dst;
        r.bytes = bytes;
        EXPECT_TRUE(requests.push(r));
        requests.publish();
        return r.ticket;
    }
};

/// The parts wired as EngineImpl::init() wires them, over one fake local transport.
class Parts : public ::testing::Test {
protected:
    void SetUp() override {
        auto t = std::make_unique<FakeTransport>();
        fake_ = t.get();
        transports_.add(std::move(t));
        limits_.regions = 16;
        limits_.registered_bytes = 1 << 20;
        NodeQuotas quotas;
        quotas.max_mappings = 64;
        quotas.registered_cap = (1 << 20) + 4096;
        quotas.cap_source = "set";
        lifecycle_ = std::make_unique<RegionLifecycle>(limits_, quotas, regions_, transports_,
                                                       sessions_, nullptr, counters_);
        pipeline_ =
            std::make_unique<RequestPipeline>(limits_.in_flight, sessions_, regions_, *lifecycle_,
                                              transports_, nullptr, stats_, counters_);
    }

    Client connect() {
        auto s = std::make_unique<Session>();
        s->id = sessions_.nextId();
        s->cred = ipc::PeerCred{::getpid(), ::getuid(), ::getgid()};
        const auto g = ipc::SegmentGeometry::forDepth(kDepth);
        std::string error;
        EXPECT_EQ(ipc::createSegment(g.total_bytes, s->cred.uid, s->cred.gid, &s->segment, &error),
                  0)
            << error;
        void *base = s->segment.mapping.data();
        ipc::initSegment(base, g, s->id);
        s->view = ipc::SegmentView::at(base, g);
        s->requests =
            ipc::RingConsumer<ipc::Request>(s->view.request_ctl, s->view.requests, kDepth);
        s->completions =
            ipc::RingProducer<ipc::Completion>(s->view.completion_ctl, s->view.completions, kDepth);
        s->notifications = ipc::RingProducer<ipc::Notification>(s->view.notification_ctl,
                                                                s->view.notifications, kDepth);
        Client c;
        c.requests = ipc::RingProducer<ipc::Request>(s->view.request_ctl, s->view.requests, kDepth);
        c.completions =
            ipc::RingConsumer<ipc::Completion>(s->view.completion_ctl, s->view.completions, kDepth);
        c.notifications = ipc::RingConsumer<ipc::Notification>(s->view.notification_ctl,
                                                               s->view.notifications, kDepth);
        lifecycle_->mapped();
        c.s = &sessions_.add(std::move(s));
        return c;
    }

    RegionId alloc(Session &s, uint64_t bytes) {
        RegionId id = 0;
        ipc::UniqueFd fd;
        Status st = lifecycle_->allocHost(s, bytes, &id, &fd);
        EXPECT_TRUE(st.isOk()) << st.message();
        return id;
    }

    /// Exposes `region` to every local client and gives `writer` a handle to it.
    uint64_t exposeTo(RegionId region, Session &writer, const std::string &name) {
        RegionAccess access;
        access.any_local = true;
        EXPECT_TRUE(regions_.expose(region, name, access).isOk());
        auto r = regions_.find(region);
        return writer.remoteHandle(RemoteRef{kLocalPeer, region, r->bytes}, limits_.regions);
    }

    config::LimitsConfig limits_;
    RegionTable regions_;
    TransportSet transports_;
    FakeTransport *fake_ = nullptr;
    SessionTable sessions_;
    EngineCounters counters_;
    EngineStats stats_{std::vector<std::string>{"node-a"}};
    std::unique_ptr<RegionLifecycle> lifecycle_;
    std::unique_ptr<RequestPipeline> pipeline_;
};

// ---- Admission

TEST(Admission, RootAndOurUidGetInAnyOtherUidOnlyWhenListed) {
    config::SecurityConfig sec;
    config::LimitsConfig limits;
    Admission a(sec, limits);
    std::string why;
    EXPECT_TRUE(a.allowed(ipc::PeerCred{1, 0, 0}, -1, &why));
    EXPECT_TRUE(a.allowed(ipc::PeerCred{1, ::geteuid(), 0}, -1, &why));
    const uid_t other = ::geteuid() + 4242;
    EXPECT_FALSE(a.allowed(ipc::PeerCred{1, other, 4242}, -1, &why));
    EXPECT_NE(why.find("uid " + std::to_string(other)), std::string::npos) << why;
    EXPECT_NE(why.find("allowed_uids/allowed_gids"), std::string::npos) << why;
    sec.allowed_uids = {other};
    EXPECT_TRUE(a.allowed(ipc::PeerCred{1, other, 4242}, -1, &why));
}

TEST(Admission, SessionCapsCountOpenedSessionsAndGiveThemBackWhenClosed) {
    config::SecurityConfig sec;
    config::LimitsConfig limits;
    limits.sessions_per_uid = 2;
    limits.sessions_per_pid = 1;
    limits.fd_reserve = 0;
    Admission a(sec, limits);
    std::string why;
    const ipc::PeerCred first{100, 5000, 5000}, same_pid{100, 5000, 5000};
    const ipc::PeerCred second{101, 5000, 5000}, third{102, 5000, 5000};
    ASSERT_TRUE(a.admit(first, 0, &why));
    a.opened(first);
    EXPECT_FALSE(a.admit(same_pid, 1, &why));
    EXPECT_NE(why.find("sessions_per_pid"), std::string::npos) << why;
    ASSERT_TRUE(a.admit(second, 1, &why));
    a.opened(second);
    EXPECT_FALSE(a.admit(third, 2, &why));
    EXPECT_NE(why.find("quota: uid 5000 holds 2 sessions"), std::string::npos) << why;
    // pid 0 (a pid namespace we cannot see into) is never held to the per-pid cap.
    a.closed(second);
    const ipc::PeerCred unseen{0, 6000, 6000};
    a.opened(unseen);
    EXPECT_TRUE(a.admit(unseen, 2, &why)) << why;
    a.closed(first);
    EXPECT_TRUE(a.admit(same_pid, 1, &why)) << why;
}

// ---- SessionTable

TEST(SessionTable, CloseKeepsTheFirstReasonAndQueuesTheSessionOnce) {
    SessionTable t;
    auto s = std::make_unique<Session>();
    s->id = t.nextId();
    Session &ref = t.add(std::move(s));
    EXPECT_EQ(t.find(ref.id), &ref);
    ASSERT_EQ(t.active().size(), 1u);
    t.close(ref, "first");
    t.close(ref, "second");
    EXPECT_TRUE(ref.closing);
    EXPECT_EQ(ref.close_reason, "first");
    EXPECT_EQ(t.takeClosed(), std::vector<SessionId>{ref.id});
    EXPECT_FALSE(t.anyClosed());
    const SessionId id = ref.id;
    t.erase(id);
    EXPECT_EQ(t.find(id), nullptr);
    EXPECT_TRUE(t.active().empty());
}

// ---- RegionLifecycle

TEST_F(Parts, AReleasedRegionIsRetiredOnlyWhenItsLastWriteEnds) {
    Client c = connect();
    const RegionId id = alloc(*c.s, 4096);
    // Registered with the transports under the id the table then holds it by.
    ASSERT_EQ(fake_->registered, std::vector<RegionId>{id});
    auto r = regions_.find(id);
    ++r->users;  // a write in flight
    ++r->users;  // and another
    lifecycle_->release(r);
    EXPECT_EQ(regions_.find(id), nullptr) << "gone from the table at once";
    EXPECT_TRUE(r->revoked.load());
    EXPECT_TRUE(fake_->deregistered.empty()) << "the transports keep it while writes use it";
    EXPECT_EQ(lifecycle_->retiring(), 1u);
    lifecycle_->dropUser(r);
    EXPECT_TRUE(fake_->deregistered.empty());
    lifecycle_->dropUser(r);
    EXPECT_EQ(fake_->deregistered, std::vector<RegionId>{id});
    EXPECT_EQ(lifecycle_->retiring(), 0u);
}

TEST_F(Parts, ARegionATransportRefusesIsLetGoByAllAndNeverAdded) {
    Client c = connect();
    const RegionId first = alloc(*c.s, 4096);
    fake_->refuse_registration = true;
    RegionId id = 0;
    ipc::UniqueFd fd;
    Status st = lifecycle_->allocHost(*c.s, 4096, &id, &fd);
    EXPECT_EQ(st.code(), Code::kNoMemory);
    EXPECT_EQ(st.message(), "no room for it");
    ASSERT_EQ(fake_->registered.size(), 2u);
    const RegionId refused = fake_->registered[1];
    EXPECT_NE(refused, 0u);
    EXPECT_NE(refused, first);
    EXPECT_EQ(fake_->deregistered, std::vector<RegionId>{refused});
    EXPECT_EQ(regions_.find(refused), nullptr);
    EXPECT_EQ(regions_.size(), 1u);
    EXPECT_EQ(c.s->host_bytes, 4096u) << "the refused buffer is not counted";
    fake_->refuse_registration = false;
    const RegionId next = alloc(*c.s, 4096);
    EXPECT_GT(next, refused) << "ids are never reused";
}

TEST_F(Parts, RangesGoWithTheirBufferAndTheQuotasAreGivenBack) {
    Client c = connect();
    const RegionId buf = alloc(*c.s, 8192);
    RegionId range = 0;
    ASSERT_TRUE(lifecycle_->addRange(*c.s, buf, 4096, 4096, &range).isOk());
    RegionId none = 0;
    Status outside = lifecycle_->addRange(*c.s, buf, 4096, 4097, &none);
    EXPECT_EQ(outside.code(), Code::kInvalid);
    EXPECT_EQ(outside.message(), "range outside its buffer");
    EXPECT_EQ(lifecycle_->addRange(*c.s, range, 0, 1, &none).code(), Code::kInvalid)
        << "a range of a range";
    EXPECT_EQ(c.s->host_bytes, 8192u);
    EXPECT_EQ(lifecycle_->nodeHostBytes(), 8192u);
    EXPECT_EQ(lifecycle_->mappings(), 2u) << "the session's segment and the buffer";

    lifecycle_->release(regions_.find(buf));
    EXPECT_EQ(regions_.find(range), nullptr);
    EXPECT_EQ(fake_->deregistered, (std::vector<RegionId>{buf, range}));
    EXPECT_EQ(c.s->host_bytes, 0u);
    EXPECT_EQ(lifecycle_->nodeHostBytes(), 0u);
    EXPECT_EQ(lifecycle_->mappings(), 1u);
    EXPECT_EQ(counters_.quota_refusals, 0u);
}

TEST_F(Parts, EachQuotaRefusesWithItsReasonAndIsCounted) {
    Client a = connect();
    Client b = connect();
    RegionId id = 0;
    ipc::UniqueFd fd;
    Status st = lifecycle_->allocHost(*a.s, (1 << 20) + 1, &id, &fd);
    EXPECT_EQ(st.code(), Code::kNoMemory);
    EXPECT_NE(st.message().find("[limits] registered_bytes"), std::string::npos) << st.message();
    alloc(*a.s, 1 << 20);
    st = lifecycle_->allocHost(*b.s, 8192, &id, &fd);
    EXPECT_EQ(st.code(), Code::kNoMemory);
    EXPECT_NE(st.message().find("all clients together past [limits] node_registered_bytes"),
              std::string::npos)
        << st.message();
    EXPECT_NE(st.message().find("(set; they hold"), std::string::npos) << st.message();
    EXPECT_EQ(counters_.quota_refusals, 2u);
    EXPECT_TRUE(fake_->deregistered.empty());
}

// ---- RequestPipeline

TEST_F(Parts, WritesToAFullTransportWaitInTheirPeersQueueInOrderAndEachEndsOnce) {
    Client c = connect();
    const RegionId src = alloc(*c.s, 4096);
    const uint64_t dst = exposeTo(alloc(*c.s, 4096), *c.s, "target");
    fake_->full = true;
    std::vector<uint64_t> tickets;
    for (int i = 0; i < 3; ++i) {
        tickets.push_back(c.write(src, dst, 64));
    }
    EXPECT_EQ(pipeline_->drainRequests(), 3u);
    EXPECT_EQ(fake_->attempts, 1u) << "only the first is tried; the rest queue behind it";
    EXPECT_EQ(pipeline_->queued(), 3u);
    EXPECT_EQ(pipeline_->inFlight(), 3u);
    EXPECT_EQ(c.s->in_flight, 3u);
    EXPECT_EQ(regions_.find(src)->users, 3u);
    EXPECT_EQ(pipeline_->pumpQueues(), 0u) << "still full";

    fake_->full = false;
    EXPECT_EQ(pipeline_->pumpQueues(), 3u);
    EXPECT_EQ(pipeline_->queued(), 0u);
    ASSERT_EQ(fake_->posted.size(), 3u);
    EXPECT_LT(fake_->posted[0], fake_->posted[1]);
    EXPECT_LT(fake_->posted[1], fake_->posted[2]);
    for (uint64_t op : fake_->posted) {
        pipeline_->completed(op, Code::kOk, "");
    }
    pipeline_->completed(fake_->posted[0], Code::kOk, "");  // a second end is ignored
    pipeline_->publishAll();
    for (uint64_t t : tickets) {
        ipc::Completion done{};
        ASSERT_TRUE(c.completions.pop(done));
        EXPECT_EQ(done.ticket, t);
        EXPECT_EQ(done.status, static_cast<int32_t>(Code::kOk));
        EXPECT_EQ(done.bytes, 64u);
    }
    ipc::Completion extra{};
    EXPECT_FALSE(c.completions.pop(extra)) << "each write ends exactly once";
    EXPECT_EQ(pipeline_->inFlight(), 0u);
    EXPECT_EQ(c.s->in_flight, 0u);
    EXPECT_EQ(regions_.find(src)->users, 0u);
    EXPECT_EQ(counters_.writes_local, 3u);
}

TEST_F(Parts, AClientGoneEndsItsQueuedWritesAndTheirDeregisteredSourceRetires) {
    Client c = connect();
    const RegionId src = alloc(*c.s, 4096);
    const uint64_t dst = exposeTo(alloc(*c.s, 4096), *c.s, "target");
    fake_->full = true;
    c.write(src, dst, 64);
    c.write(src, dst, 64);
    ASSERT_EQ(pipeline_->drainRequests(), 2u);
    ASSERT_EQ(pipeline_->queued(), 2u);
    lifecycle_->release(regions_.find(src));
    EXPECT_TRUE(fake_->deregistered.empty()) << "two queued writes still read it";

    sessions_.close(*c.s, "client hung up");
    EXPECT_EQ(pipeline_->dropSession(*c.s), 2u);
    EXPECT_EQ(pipeline_->queued(), 0u);
    EXPECT_EQ(pipeline_->inFlight(), 0u);
    EXPECT_EQ(fake_->deregistered, std::vector<RegionId>{src});
    EXPECT_TRUE(fake_->posted.empty()) << "nothing is sent for a client that is gone";
    pipeline_->publishAll();
    ipc::Completion done{};
    EXPECT_FALSE(c.completions.pop(done)) << "a closing client is told nothing";
}

TEST_F(Parts, ALocalArrivalWaitsForTheCompletionThatNamesItsWriter) {
    Client owner = connect();
    Client writer = connect();
    const RegionId target = alloc(*owner.s, 4096);
    const RegionId src = alloc(*writer.s, 4096);
    const uint64_t dst = exposeTo(target, *writer.s, "target");
    writer.s->cred.uid = 4242;  // the writer's uid as SO_PEERCRED gave it
    writer.write(src, dst, 128, 7);
    ASSERT_EQ(pipeline_->drainRequests(), 1u);
    ASSERT_EQ(fake_->posted.size(), 1u);

    // The local transport's progress(): arrived(), then completed() of the same write.
    pipeline_->beginProgress(true);
    pipeline_->arrived(target, 7, 0, 128, "node-a");
    EXPECT_EQ(owner.s->counters.notifications, 0u) << "held until the completion";
    pipeline_->completed(fake_->posted[0], Code::kOk, "");
    pipeline_->endProgress();
    EXPECT_EQ(owner.s->counters.notifications, 1u);

    // A peer's write: no completion here, the writer is the peer.
    pipeline_->beginProgress(false);
    pipeline_->arrived(target, 8, 0, 64, "node-b");
    pipeline_->endProgress();

    pipeline_->publishAll();
    ipc::Notification n{};
    ASSERT_TRUE(owner.notifications.pop(n));
    EXPECT_EQ(n.region, target);
    EXPECT_EQ(n.imm, 7u);
    EXPECT_EQ(n.bytes, 128u);
    EXPECT_EQ(n.writer_uid, 4242u);
    EXPECT_STREQ(n.peer, "node-a");
    ASSERT_TRUE(owner.notifications.pop(n));
    EXPECT_EQ(n.imm, 8u);
    EXPECT_EQ(n.writer_uid, ipc::kWriterUidPeer);
    ipc::Completion done{};
    ASSERT_TRUE(writer.completions.pop(done));
    EXPECT_EQ(done.status, static_cast<int32_t>(Code::kOk));
    EXPECT_EQ(counters_.notifications, 2u);
}

}  // namespace
}  // namespace tensorlane::sidecar
