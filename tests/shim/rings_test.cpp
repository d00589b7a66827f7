// The shim's rings against a session segment made here, with this test as the sidecar: the
// one submit path (plain and gated), its refusals, and what a drain moves into the tables.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "control_channel.hpp"
#include "last_error.hpp"
#include "rings.hpp"
#include "tensorlane/ipc/doorbell.hpp"
#include "tensorlane/ipc/layout.hpp"
#include "tensorlane/ipc/shm.hpp"
#include "tensorlane/ipc/spsc_ring.hpp"
#include "tensorlane/tensorlane.h"

namespace tensorlane::shim {
namespace {

constexpr uint32_t kDepth = 16;

/// A session segment with the sidecar's ends of its rings, and the client's Rings on it.
class RingsTest : public ::testing::Test {
protected:
    void SetUp() override {
        geometry_ = ipc::SegmentGeometry::forDepth(kDepth);
        std::string error;
        ASSERT_EQ(ipc::createSegment(geometry_.total_bytes, ::getuid(), ::getgid(), &seg_, &error),
                  0)
            << error;
        ipc::initSegment(seg_.mapping.data(), geometry_, 7);
        view_ = ipc::SegmentView::at(seg_.mapping.data(), geometry_);
        requests_ = ipc::RingConsumer<ipc::Request>(view_.request_ctl, view_.requests, kDepth);
        completions_ =
            ipc::RingProducer<ipc::Completion>(view_.completion_ctl, view_.completions, kDepth);
        notifications_ = ipc::RingProducer<ipc::Notification>(view_.notification_ctl,
                                                              view_.notifications, kDepth);
        ipc::UniqueFd to_sidecar;
        ASSERT_EQ(ipc::makeEventFd(&to_sidecar), 0);
        ipc::UniqueFd fd(::dup(seg_.fd.get()));
        ASSERT_TRUE(fd);
        ASSERT_EQ(rings_.open(std::move(fd), geometry_.total_bytes, std::move(to_sidecar)),
                  Code::kOk);
    }

    /// n no-ops through Rings::submit.
    tl_status nops(size_t n, std::vector<tl_ticket> *tickets, size_t *submitted) {
        std::vector<ipc::Request> reqs(n);
        for (auto &r : reqs) {
            r.op = static_cast<uint8_t>(ipc::Op::kNop);
        }
        tickets->assign(n, 0);
        return rings_.submit(reqs.data(), n, tickets->data(), submitted);
    }

    /// The sidecar's head of the request ring set past what the client ever produced.
    void corruptRequestRing() { view_.request_ctl->head.value.store(1000); }

    ipc::SegmentGeometry geometry_;
    ipc::SharedSegment seg_;
    ipc::SegmentView view_;
    ipc::RingConsumer<ipc::Request> requests_;
    ipc::RingProducer<ipc::Completion> completions_;
    ipc::RingProducer<ipc::Notification> notifications_;
    ControlChannel control_;  // never connected: it only says whether the connection is dead
    Rings rings_{control_};
};

/// A stream gate that counts what it was asked to queue.
class CountingGate final : public StreamGate {
public:
    tl_status enqueue(uint64_t, uint32_t) override {
        ++calls;
        return TL_OK;
    }
    int calls = 0;
};

TEST_F(RingsTest, SubmitGivesSequentialTicketsAndPublishesTheRequests) {
    std::vector<tl_ticket> t;
    size_t submitted = 0;
    ASSERT_EQ(nops(3, &t, &submitted), TL_OK) << lastError();
    EXPECT_EQ(submitted, 3u);
    EXPECT_EQ(t, (std::vector<tl_ticket>{1, 2, 3}));
    ASSERT_EQ(requests_.available(), 3u);
    for (uint32_t i = 0; i < 3; ++i) {
        const ipc::Request r = requests_.read(i);
        EXPECT_EQ(r.ticket, t[i]);
        EXPECT_EQ(r.op, static_cast<uint8_t>(ipc::Op::kNop));
        EXPECT_EQ(r.flags, 0) << "no stream segment: no slot";
    }
    std::lock_guard lock(rings_.mutex());
    EXPECT_EQ(rings_.tickets().pending(), 3u);
}

TEST_F(RingsTest, SubmitPastTheDepthTakesWhatFitsAndSaysAgain) {
    std::vector<tl_ticket> t;
    size_t submitted = 0;
    EXPECT_EQ(nops(kDepth + 2, &t, &submitted), TL_EAGAIN);
    EXPECT_EQ(submitted, kDepth);
    EXPECT_EQ(std::string(lastError()),
              std::to_string(kDepth) + " requests outstanding; wait on a ticket and retry");
    EXPECT_EQ(requests_.available(), kDepth);
}

TEST_F(RingsTest, SubmitOnACorruptRingIsAConnectionError) {
    corruptRequestRing();
    std::vector<tl_ticket> t;
    size_t submitted = 99;
    EXPECT_EQ(nops(1, &t, &submitted), TL_ECONN);
    EXPECT_EQ(submitted, 0u);
    EXPECT_STREQ(lastError(), "request ring corrupted");
}

TEST_F(RingsTest, GatedSubmitOnACorruptRingIsAConnectionErrorAndQueuesNothing) {
    // tl_write_on_stream once had its own copy of the submit path without this check: a
    // corrupt ring read as "requests outstanding" (TL_EAGAIN), to be retried for ever.
    corruptRequestRing();
    ipc::Request r{};
    r.op = static_cast<uint8_t>(ipc::Op::kWrite);
    r.flags = ipc::kRequestHasSlot | ipc::kRequestGated;
    tl_ticket t = 0;
    CountingGate gate;
    EXPECT_EQ(rings_.submit(&r, 1, &t, nullptr, &gate), TL_ECONN);
    EXPECT_STREQ(lastError(), "request ring corrupted");
    EXPECT_EQ(gate.calls, 0) << "nothing may be queued on the stream for a request never sent";
    EXPECT_EQ(t, 0u) << "no ticket for a request that did not go in";
}

TEST_F(RingsTest, SubmitAfterTheConnectionDiedFails) {
    control_.markDead("the sidecar went away");
    std::vector<tl_ticket> t;
    size_t submitted = 99;
    EXPECT_EQ(nops(1, &t, &submitted), TL_ECONN);
    EXPECT_STREQ(lastError(), "sidecar connection lost: the sidecar went away");
    EXPECT_EQ(requests_.available(), 0u);
}

TEST_F(RingsTest, DrainRecordsCompletionsAndFreesTheirTickets) {
    std::vector<tl_ticket> t;
    size_t submitted = 0;
    ASSERT_EQ(nops(kDepth, &t, &submitted), TL_OK) << lastError();
    requests_.release(requests_.available());
    ipc::Completion c{};
    c.ticket = t[0];
    c.status = static_cast<int32_t>(Code::kPermission);
    ASSERT_TRUE(completions_.push(c));
    completions_.publish();
    // The ring is full of tickets: the next submit drains and finds room for one.
    std::vector<tl_ticket> more;
    EXPECT_EQ(nops(1, &more, &submitted), TL_OK) << lastError();
    EXPECT_EQ(more[0], kDepth + 1);
    std::lock_guard lock(rings_.mutex());
    EXPECT_EQ(rings_.tickets().state(t[0]), static_cast<int32_t>(Code::kPermission));
    EXPECT_EQ(rings_.tickets().state(t[1]), TicketTable::kPending);
}

TEST_F(RingsTest, DrainKeepsAtMostFourDepthsOfNotificationsUnlessAll) {
    // The ring holds one depth; fill it and let the drain take it, four times over, then once
    // more: the fifth batch stays in the ring until a drain with `all` takes it.
    ipc::Notification n{};
    n.region = 5;
    uint32_t imm = 0;
    for (int round = 0; round < 5; ++round) {
        for (uint32_t i = 0; i < kDepth; ++i) {
            n.imm = imm++;
            ASSERT_TRUE(notifications_.push(n));
        }
        notifications_.publish();
        std::lock_guard lock(rings_.mutex());
        rings_.drainLocked();
    }
    std::lock_guard lock(rings_.mutex());
    EXPECT_EQ(rings_.notes().size(), 4u * kDepth);
    rings_.drainLocked(true);
    ASSERT_EQ(rings_.notes().size(), 5u * kDepth);
    EXPECT_EQ(rings_.notes().front().ex.n.imm, 0u);
    EXPECT_EQ(rings_.notes().back().ex.n.imm, 5u * kDepth - 1);
}

TEST_F(RingsTest, DrainCopiesEveryFieldOfANotification) {
    // tl_notification_ex.dropped was read from reserved2[0] after the layout had named the
    // field `dropped` (offset 96): a client was never told how many notifications it lost.
    ipc::Notification n{};
    n.region = 5;
    n.offset = 64;
    n.bytes = 4096;
    n.imm = 11;
    n.writer_uid = 1234;
    ipc::copyName(n.peer, sizeof(n.peer), "node-b");
    n.dropped = 7;
    n.reserved4 = 99;  // not the count
    ASSERT_TRUE(notifications_.push(n));
    notifications_.publish();
    std::lock_guard lock(rings_.mutex());
    rings_.drainLocked();
    ASSERT_EQ(rings_.notes().size(), 1u);
    const tl_notification_ex &out = rings_.notes().front().ex;
    EXPECT_EQ(out.n.region, 5u);
    EXPECT_EQ(out.n.offset, 64u);
    EXPECT_EQ(out.n.bytes, 4096u);
    EXPECT_EQ(out.n.imm, 11u);
    EXPECT_EQ(out.writer_uid, 1234u);
    EXPECT_STREQ(out.n.peer, "node-b");
    EXPECT_EQ(out.dropped, 7u);
}

}  // namespace
}  // namespace tensorlane::shim
