// The shim's ticket table: every ticket ends exactly once, whatever order completions come in.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "ticket_table.hpp"

namespace tensorlane::shim {
namespace {

TEST(TicketTable, CompleteThenConsume) {
    TicketTable t(16);
    t.addPending(1);
    EXPECT_EQ(t.pending(), 1u);
    EXPECT_EQ(t.state(1), TicketTable::kPending);
    EXPECT_TRUE(t.complete(1, 0));
    EXPECT_FALSE(t.complete(1, 0)) << "a second completion of the same ticket is bogus";
    EXPECT_EQ(t.state(1), 0);
    t.erase(1);
    EXPECT_EQ(t.state(1), TicketTable::kUnknown);
    EXPECT_EQ(t.pending(), 0u);
    EXPECT_FALSE(t.complete(2, 0)) << "never issued";
    EXPECT_FALSE(t.complete(0, 0));
}

TEST(TicketTable, PendingTicketOvertakenByShortOnesIsNeverEvicted) {
    // Depth 16 gives a window of 64 slots. One long write stays pending while 70 no-ops are
    // issued and consumed: ticket 65 needs ticket 1's slot. The long write must still complete.
    TicketTable t(16);
    t.addPending(1);
    for (uint64_t k = 2; k <= 71; ++k) {
        t.addPending(k);
        ASSERT_TRUE(t.complete(k, 0)) << k;
        t.erase(k);
    }
    EXPECT_EQ(t.state(1), TicketTable::kPending);
    EXPECT_EQ(t.pending(), 1u);
    EXPECT_EQ(t.overflowed(), 1u);
    EXPECT_TRUE(t.complete(1, 3));
    EXPECT_EQ(t.state(1), 3);
    EXPECT_EQ(t.pending(), 0u);
    t.erase(1);
    EXPECT_EQ(t.state(1), TicketTable::kUnknown);
    EXPECT_EQ(t.overflowed(), 0u);
}

TEST(TicketTable, FailPendingReachesOverflowedTickets) {
    TicketTable t(16);
    t.addPending(1);  // pending, will be pushed aside
    t.addPending(2);
    ASSERT_TRUE(t.complete(2, 0));  // finished, never waited for: pushed aside too
    for (uint64_t k = 3; k <= 70; ++k) {
        t.addPending(k);
        ASSERT_TRUE(t.complete(k, 0));
        t.erase(k);
    }
    t.addPending(71);
    EXPECT_EQ(t.overflowed(), 2u);
    t.failPending(9);
    EXPECT_EQ(t.pending(), 0u);
    EXPECT_EQ(t.state(1), 9);
    EXPECT_EQ(t.state(2), 0) << "a finished ticket keeps its own status";
    EXPECT_EQ(t.state(71), 9);
}

TEST(TicketTable, ErasingAPendingOverflowedTicketKeepsTheCount) {
    TicketTable t(16);
    t.addPending(1);
    for (uint64_t k = 2; k <= 66; ++k) {
        t.addPending(k);
        ASSERT_TRUE(t.complete(k, 0));
        t.erase(k);
    }
    EXPECT_EQ(t.pending(), 1u);
    t.erase(1);  // a caller that gives up on it
    EXPECT_EQ(t.pending(), 0u);
    EXPECT_FALSE(t.complete(1, 0));
}

TEST(TicketTable, RandomCompletionOrderEndsEveryTicketExactlyOnce) {
    // At most `depth` pending at once (as the shim enforces), completions in random order,
    // consumers waiting on random finished tickets late: every ticket ends once, none is lost.
    constexpr size_t kDepth = 16;
    TicketTable t(kDepth);
    std::mt19937_64 rng(1);
    std::vector<uint64_t> pending, finished;
    uint64_t next = 1;
    size_t ended = 0;
    for (int step = 0; step < 200000; ++step) {
        const auto action = rng() % 3;
        if (action == 0 && pending.size() < kDepth) {
            t.addPending(next);
            pending.push_back(next++);
        } else if (action == 1 && !pending.empty()) {
            const size_t i = rng() % pending.size();
            ASSERT_TRUE(t.complete(pending[i], static_cast<int32_t>(pending[i] % 7)));
            finished.push_back(pending[i]);
            pending[i] = pending.back();
            pending.pop_back();
        } else if (!finished.empty() && rng() % 4 == 0) {
            const size_t i = rng() % finished.size();
            ASSERT_EQ(t.state(finished[i]), static_cast<int32_t>(finished[i] % 7));
            t.erase(finished[i]);
            ++ended;
            finished[i] = finished.back();
            finished.pop_back();
        }
        ASSERT_EQ(t.pending(), pending.size());
    }
    for (uint64_t p : pending) {
        ASSERT_EQ(t.state(p), TicketTable::kPending);
    }
    for (uint64_t f : finished) {
        ASSERT_EQ(t.state(f), static_cast<int32_t>(f % 7));
    }
    EXPECT_GT(ended, 1000u);
}

}  // namespace
}  // namespace tensorlane::shim
