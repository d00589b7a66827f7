// Unit tier (no GPU): the sidecar's half of the stream-ordered calls, driven by hand the way a
// client's GPU stream would drive it: gates that open only at their ticket (cyclically), done
// words written before completions, notification hand-overs that lose nothing, credits, and
// subscriptions of a region that goes away releasing their streams.
#include <gtest/gtest.h>
#include <unistd.h>

#include "stream_sync.hpp"
#include "tensorlane/ipc/layout.hpp"
#include "tensorlane/ipc/shm.hpp"

using namespace tensorlane;
using sidecar::Code;
using sidecar::SessionStreams;
using sidecar::WriteOp;

namespace {

struct Streams {
    std::unique_ptr<SessionStreams> s;
    ipc::Mapping client;  ///< the client's mapping of the same segment
    ipc::StreamView view;
    Streams() {
        ipc::UniqueFd fd;
        std::string error;
        s = SessionStreams::create(64, ::getuid(), ::getgid(), &fd, &error);
        EXPECT_TRUE(s) << error;
        const uint64_t size = ipc::segmentSize(fd.get());
        EXPECT_EQ(ipc::mapSegment(fd.get(), size, &client), 0);
        ipc::StreamGeometry g;
        EXPECT_TRUE(ipc::validateStreamSegment(client.data(), client.size(), 64, &g));
        view = ipc::StreamView::at(client.data(), g);
    }
    std::atomic<uint32_t> &gate(uint32_t slot) { return view.tickets[slot].gate; }
    std::atomic<uint32_t> &flag(uint32_t slot) { return view.notify[slot].flag; }
};

WriteOp op(uint64_t id) {
    WriteOp o;
    o.op_id = id;
    return o;
}

}  // namespace

TEST(StreamSync, SegmentHasTwoTicketSlotsPerRequest) {
    Streams t;
    EXPECT_EQ(t.s->ticketSlots(), 128u);
    EXPECT_TRUE(t.s->validSlot(127));
    EXPECT_FALSE(t.s->validSlot(128));
}

TEST(StreamSync, AGateOpensAtItsTicketAndNotBefore) {
    Streams t;
    t.gate(3).store(99);  // the client reset it to ticket - 1
    t.s->hold(op(1), 3, 100);
    EXPECT_TRUE(t.s->urgent());
    EXPECT_TRUE(t.s->opened().empty());
    t.gate(3).store(100);  // the stream got there
    auto open = t.s->opened();
    ASSERT_EQ(open.size(), 1u);
    EXPECT_EQ(open[0].op_id, 1u);
    EXPECT_FALSE(t.s->urgent());
}

TEST(StreamSync, GatesCompareCyclicallyAcrossTheWrap) {
    Streams t;
    const uint64_t ticket = (uint64_t{1} << 32) + 5;  // low 32 bits: 5
    t.gate(0).store(0xfffffff0u);  // an older ticket's gate, just before the wrap
    t.s->hold(op(2), 0, ticket);
    EXPECT_TRUE(t.s->opened().empty()) << "a value before the wrap must not open it";
    t.gate(0).store(5);
    EXPECT_EQ(t.s->opened().size(), 1u);
}

TEST(StreamSync, HeldWritesAreHandedBackWhenTheSessionCloses) {
    Streams t;
    t.s->hold(op(7), 1, 10);
    t.s->hold(op(8), 2, 11);
    auto held = t.s->takeHeld();
    ASSERT_EQ(held.size(), 2u);
    EXPECT_EQ(t.s->held(), 0u);
}

TEST(StreamSync, EndedWritesTheStatusThenTheTicket) {
    Streams t;
    t.s->ended(5, 1234, Code::kNotFound);
    EXPECT_EQ(t.view.tickets[5].done.load(), 1234u);
    EXPECT_EQ(t.view.tickets[5].status, static_cast<int32_t>(Code::kNotFound));
    t.s->ended(500, 1, Code::kOk);  // a bad slot is ignored, never written out of bounds
}

TEST(StreamSync, NotificationsAreHandedOverOneAtATimeAndNoneIsLost) {
    Streams t;
    uint32_t slot = 0;
    ASSERT_TRUE(t.s->subscribe(1, 7, &slot).isOk());
    uint32_t again = 99;
    ASSERT_TRUE(t.s->subscribe(1, 7, &again).isOk());
    EXPECT_EQ(again, slot);
    EXPECT_FALSE(t.s->divert(1, 8)) << "another imm goes to the ring";
    EXPECT_TRUE(t.s->divert(1, 7));
    EXPECT_EQ(t.flag(slot).load(), 1u);
    EXPECT_FALSE(t.s->urgent());
    // Two more before the stream took the first: counted.
    EXPECT_TRUE(t.s->divert(1, 7));
    EXPECT_TRUE(t.s->divert(1, 7));
    EXPECT_TRUE(t.s->urgent());
    EXPECT_EQ(t.s->pollNotify(), 0u);  // not consumed yet
    for (int i = 0; i < 2; ++i) {
        t.flag(slot).store(0);  // the stream's wait passed and consumed it
        EXPECT_EQ(t.s->pollNotify(), 1u);
        EXPECT_EQ(t.flag(slot).load(), 1u);
    }
    EXPECT_FALSE(t.s->urgent());
    t.flag(slot).store(0);
    EXPECT_EQ(t.s->pollNotify(), 0u);
    EXPECT_EQ(t.flag(slot).load(), 0u) << "three arrivals, three hand-overs";
}

TEST(StreamSync, CreditsHandOverWhatArrivedBeforeTheSubscription) {
    Streams t;
    uint32_t slot = 0;
    ASSERT_TRUE(t.s->subscribe(2, 1, &slot).isOk());
    t.s->credit(slot, 2);
    EXPECT_EQ(t.flag(slot).load(), 1u);
    EXPECT_TRUE(t.s->urgent());
    t.flag(slot).store(0);
    EXPECT_EQ(t.s->pollNotify(), 1u);
    EXPECT_FALSE(t.s->urgent());
    t.s->credit(999, 5);  // a bad slot from the client changes nothing
}

TEST(StreamSync, ARegionThatGoesAwayReleasesItsStreamsForGood) {
    Streams t;
    uint32_t slot = 0;
    ASSERT_TRUE(t.s->subscribe(3, 4, &slot).isOk());
    EXPECT_TRUE(t.s->divert(3, 4));
    EXPECT_TRUE(t.s->divert(3, 4));  // one pending
    t.s->regionReleased(3);
    EXPECT_FALSE(t.s->urgent());
    EXPECT_TRUE(t.s->releasing());
    for (int i = 0; i < 3; ++i) {
        t.flag(slot).store(0);  // each wait that comes still passes
        t.s->pollNotify();
        EXPECT_EQ(t.flag(slot).load(), 1u);
    }
    EXPECT_FALSE(t.s->divert(3, 4)) << "no longer counted";
    uint32_t other = 0;
    ASSERT_TRUE(t.s->subscribe(3, 4, &other).isOk());
    EXPECT_NE(other, slot) << "a released flag is never given to another subscription";
}

TEST(StreamSync, SubscriptionsAreBounded) {
    Streams t;
    uint32_t slot = 0;
    for (uint32_t i = 0; i < ipc::kStreamSubscriptions; ++i) {
        ASSERT_TRUE(t.s->subscribe(10, i, &slot).isOk());
    }
    EXPECT_EQ(t.s->subscribe(11, 0, &slot).code(), Code::kNoMemory);
}
