// Unit tests of the SPSC ring: ordering, fullness, publication, wraparound, release, and the
// corruption checks against a hostile peer (DESIGN.md: every byte in a segment is hostile).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "tensorlane/ipc/spsc_ring.hpp"
#include "test_support.hpp"

namespace tensorlane::ipc {
namespace {

using test::Entry;
using test::entryIsIntact;
using test::GuardedRing;
using test::makeEntry;

constexpr uint32_t kDepth = 16;

TEST(SpscRing, PushPopPreservesOrder) {
    GuardedRing<Entry> ring(kDepth);
    auto prod = ring.producer();
    auto cons = ring.consumer();
    for (uint64_t i = 0; i < 10; ++i) {
        ASSERT_TRUE(prod.push(makeEntry(i)));
    }
    prod.publish();
    for (uint64_t i = 0; i < 10; ++i) {
        Entry e{};
        ASSERT_TRUE(cons.pop(e));
        EXPECT_EQ(e.seq, i);
        EXPECT_TRUE(entryIsIntact(e));
    }
    Entry e{};
    EXPECT_FALSE(cons.pop(e));
    EXPECT_FALSE(prod.corrupt());
    EXPECT_FALSE(cons.corrupt());
}

TEST(SpscRing, PushFailsWhenFull) {
    GuardedRing<Entry> ring(kDepth);
    auto prod = ring.producer();
    EXPECT_EQ(prod.freeSlots(), kDepth);
    for (uint32_t i = 0; i < kDepth; ++i) {
        ASSERT_TRUE(prod.push(makeEntry(i))) << "slot " << i;
    }
    EXPECT_EQ(prod.freeSlots(), 0u);
    EXPECT_FALSE(prod.push(makeEntry(kDepth)));
    prod.publish();
    // Publishing frees nothing: only the consumer's release does.
    EXPECT_FALSE(prod.push(makeEntry(kDepth)));
    EXPECT_EQ(prod.inFlight(), kDepth);
    EXPECT_FALSE(prod.corrupt());
    // The failed pushes did not overwrite the oldest entry.
    auto cons = ring.consumer();
    Entry e{};
    ASSERT_TRUE(cons.pop(e));
    EXPECT_EQ(e.seq, 0u);
}

TEST(SpscRing, UnpublishedEntriesAreInvisible) {
    GuardedRing<Entry> ring(kDepth);
    auto prod = ring.producer();
    auto cons = ring.consumer();
    for (uint64_t i = 0; i < 5; ++i) {
        ASSERT_TRUE(prod.push(makeEntry(i)));
    }
    EXPECT_EQ(ring.sharedTail(), 0u);
    EXPECT_EQ(cons.available(), 0u);
    Entry e{};
    EXPECT_FALSE(cons.pop(e));

    prod.publish();
    EXPECT_EQ(ring.sharedTail(), 5u);
    // Three more pushed but not published: the consumer sees exactly the five.
    for (uint64_t i = 5; i < 8; ++i) {
        ASSERT_TRUE(prod.push(makeEntry(i)));
    }
    EXPECT_EQ(cons.available(), 5u);
    for (uint64_t i = 0; i < 5; ++i) {
        ASSERT_TRUE(cons.pop(e));
        EXPECT_EQ(e.seq, i);
    }
    EXPECT_EQ(cons.available(), 0u);
    EXPECT_FALSE(cons.pop(e));
    prod.publish();
    EXPECT_EQ(cons.available(), 3u);
}

TEST(SpscRing, WrapsAroundOverManyLaps) {
    GuardedRing<Entry> ring(kDepth);
    auto prod = ring.producer();
    auto cons = ring.consumer();
    uint64_t next_push = 0;
    uint64_t next_pop = 0;
    // Batches of every size from 1 to depth, so the slot index wraps at every offset.
    for (int lap = 0; lap < 1000; ++lap) {
        uint32_t batch = 1 + static_cast<uint32_t>(lap % kDepth);
        for (uint32_t i = 0; i < batch; ++i) {
            ASSERT_TRUE(prod.push(makeEntry(next_push++)));
        }
        prod.publish();
        ASSERT_EQ(cons.available(), batch);
        for (uint32_t i = 0; i < batch; ++i) {
            Entry e = cons.read(i);
            ASSERT_EQ(e.seq, next_pop + i);
            ASSERT_TRUE(entryIsIntact(e));
        }
        cons.release(batch);
        next_pop += batch;
    }
    EXPECT_EQ(next_push, next_pop);
    EXPECT_GT(next_push, 100u * kDepth);
    EXPECT_EQ(prod.tail(), next_push);
    EXPECT_EQ(cons.head(), next_pop);
    EXPECT_EQ(ring.sharedHead(), next_pop);
    EXPECT_EQ(ring.sharedTail(), next_push);
    EXPECT_FALSE(prod.corrupt());
    EXPECT_FALSE(cons.corrupt());
}

TEST(SpscRing, BatchPushSinglePublish) {
    GuardedRing<Entry> ring(kDepth);
    auto prod = ring.producer();
    auto cons = ring.consumer();
    for (uint64_t i = 0; i < kDepth; ++i) {
        ASSERT_TRUE(prod.push(makeEntry(i)));
        // Nothing reaches shared memory until the one publish.
        ASSERT_EQ(ring.sharedTail(), 0u);
    }
    prod.publish();
    EXPECT_EQ(ring.sharedTail(), kDepth);
    ASSERT_EQ(cons.available(), kDepth);
    for (uint32_t i = 0; i < kDepth; ++i) {
        EXPECT_EQ(cons.read(i).seq, i);
    }
    cons.release(kDepth);
    EXPECT_EQ(ring.sharedHead(), kDepth);
}

TEST(SpscRing, ConsumerReleaseFreesSlots) {
    GuardedRing<Entry> ring(kDepth);
    auto prod = ring.producer();
    auto cons = ring.consumer();
    for (uint64_t i = 0; i < kDepth; ++i) {
        ASSERT_TRUE(prod.push(makeEntry(i)));
    }
    prod.publish();
    ASSERT_EQ(cons.available(), kDepth);
    // Reading without releasing keeps the slots: the producer must not reuse them yet.
    for (uint32_t i = 0; i < kDepth; ++i) {
        EXPECT_EQ(cons.read(i).seq, i);
    }
    EXPECT_EQ(prod.freeSlots(), 0u);
    EXPECT_FALSE(prod.push(makeEntry(100)));

    cons.release(4);
    EXPECT_EQ(prod.freeSlots(), 4u);
    EXPECT_EQ(prod.inFlight(), kDepth - 4);
    for (uint64_t i = kDepth; i < kDepth + 4; ++i) {
        ASSERT_TRUE(prod.push(makeEntry(i)));
    }
    EXPECT_FALSE(prod.push(makeEntry(999)));
    prod.publish();
    // The twelve unreleased entries are untouched, followed by the four new ones.
    ASSERT_EQ(cons.available(), kDepth - 4);
    for (uint32_t i = 0; i < kDepth - 4; ++i) {
        EXPECT_EQ(cons.read(i).seq, 4u + i);
    }
    cons.release(kDepth - 4);
    ASSERT_EQ(cons.available(), 4u);
    for (uint32_t i = 0; i < 4; ++i) {
        EXPECT_EQ(cons.read(i).seq, kDepth + i);
    }
}

// A producer that attaches to a ring which still holds unread entries must not treat it as
// empty: it learns the consumer's head before writing a slot. (Regression: it used to start with
// head = tail and overwrote the unread entries.)
TEST(SpscRing, ProducerAttachingLaterDoesNotOverwriteUnreadEntries) {
    GuardedRing<Entry> ring(kDepth);
    {
        auto first = ring.producer();
        for (uint64_t i = 0; i < 10; ++i) {
            ASSERT_TRUE(first.push(makeEntry(i)));
        }
        first.publish();
    }
    auto cons = ring.consumer();
    Entry e{};
    ASSERT_TRUE(cons.pop(e));
    ASSERT_TRUE(cons.pop(e));  // head 2, tail 10: eight unread

    auto second = ring.producer();
    EXPECT_EQ(second.tail(), 10u);
    EXPECT_EQ(second.freeSlots(), kDepth - 8);
    uint64_t pushed = 0;
    while (second.push(makeEntry(10 + pushed))) {
        ++pushed;
    }
    EXPECT_EQ(pushed, kDepth - 8);
    EXPECT_FALSE(second.corrupt());
    second.publish();
    for (uint64_t i = 2; i < 10 + pushed; ++i) {
        ASSERT_TRUE(cons.pop(e));
        EXPECT_EQ(e.seq, i);
    }
    EXPECT_FALSE(cons.corrupt());
}

TEST(SpscRing, ConsumerAttachingLaterStartsAtSharedHead) {
    GuardedRing<Entry> ring(kDepth);
    auto prod = ring.producer();
    for (uint64_t i = 0; i < 6; ++i) {
        ASSERT_TRUE(prod.push(makeEntry(i)));
    }
    prod.publish();
    {
        auto first = ring.consumer();
        Entry e{};
        ASSERT_TRUE(first.pop(e));
        ASSERT_TRUE(first.pop(e));
    }
    auto second = ring.consumer();
    EXPECT_EQ(second.head(), 2u);
    EXPECT_EQ(second.available(), 4u);
    EXPECT_EQ(second.read(0).seq, 2u);
}

// A full ring is exactly depth entries in flight: tail - head == depth is legal, not corrupt.
TEST(SpscRing, TailExactlyDepthAheadIsNotCorrupt) {
    GuardedRing<Entry> ring(kDepth);
    auto cons = ring.consumer();
    ring.setTail(kDepth);
    EXPECT_EQ(cons.available(), kDepth);
    EXPECT_FALSE(cons.corrupt());
}

// Checks that a corrupt consumer answers 0/false to everything and touches no slot: the slots are
// made PROT_NONE, so any read of them would crash the test.
void expectConsumerDead(GuardedRing<Entry> &ring, RingConsumer<Entry> &cons) {
    ring.lockSlots();
    Entry e = makeEntry(12345);
    EXPECT_TRUE(cons.corrupt());
    for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(cons.available(), 0u);
        EXPECT_FALSE(cons.pop(e));
    }
    EXPECT_EQ(e.seq, 12345u) << "pop wrote its output although it failed";
    // A producer that now publishes an honest-looking tail does not revive the ring.
    ring.setTail(cons.head() + 1);
    EXPECT_EQ(cons.available(), 0u);
    EXPECT_FALSE(cons.pop(e));
    ring.unlockSlots();
}

TEST(SpscRing, ConsumerFlagsTailBehindHead) {
    GuardedRing<Entry> ring(kDepth);
    auto prod = ring.producer();
    auto cons = ring.consumer();
    for (uint64_t i = 0; i < 8; ++i) {
        ASSERT_TRUE(prod.push(makeEntry(i)));
    }
    prod.publish();
    Entry e{};
    for (int i = 0; i < 8; ++i) {
        ASSERT_TRUE(cons.pop(e));
    }
    ASSERT_FALSE(cons.corrupt());
    ring.setTail(3);  // behind the head the consumer has reached
    EXPECT_EQ(cons.available(), 0u);
    expectConsumerDead(ring, cons);
}

TEST(SpscRing, ConsumerFlagsTailTooFarAhead) {
    for (uint64_t bogus_gap : {uint64_t{kDepth} + 1, uint64_t{kDepth} * 2, uint64_t{1} << 40,
                               std::numeric_limits<uint64_t>::max() - 5}) {
        GuardedRing<Entry> ring(kDepth);
        auto prod = ring.producer();
        auto cons = ring.consumer();
        for (uint64_t i = 0; i < 5; ++i) {
            ASSERT_TRUE(prod.push(makeEntry(i)));
        }
        prod.publish();
        Entry e{};
        ASSERT_TRUE(cons.pop(e));
        ASSERT_TRUE(cons.pop(e));
        ASSERT_EQ(cons.available(), 3u);
        cons.release(3);  // head 5: caught up, so the next call reloads the tail
        ring.setTail(cons.head() + bogus_gap);
        EXPECT_EQ(cons.available(), 0u) << "gap " << bogus_gap;
        expectConsumerDead(ring, cons);
    }
}

TEST(SpscRing, ConsumerFlagsGarbageTailOnFirstLook) {
    GuardedRing<Entry> ring(kDepth);
    ring.setTail(0xdeadbeefdeadbeefull);
    auto cons = ring.consumer();
    EXPECT_EQ(cons.available(), 0u);
    expectConsumerDead(ring, cons);
}

// Checks that a corrupt producer refuses every push without writing a slot (slots PROT_NONE).
void expectProducerDead(GuardedRing<Entry> &ring, RingProducer<Entry> &prod) {
    ring.lockSlots();
    EXPECT_TRUE(prod.corrupt());
    uint64_t tail = prod.tail();
    for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(prod.freeSlots(), 0u);
        EXPECT_FALSE(prod.push(makeEntry(777)));
    }
    EXPECT_EQ(prod.tail(), tail);
    // An honest-looking head later does not revive it.
    ring.setHead(tail);
    EXPECT_EQ(prod.freeSlots(), 0u);
    EXPECT_FALSE(prod.push(makeEntry(778)));
    ring.unlockSlots();
}

TEST(SpscRing, ProducerFlagsHeadAheadOfTail) {
    GuardedRing<Entry> ring(kDepth);
    auto prod = ring.producer();
    for (uint64_t i = 0; i < 4; ++i) {
        ASSERT_TRUE(prod.push(makeEntry(i)));
    }
    prod.publish();
    ring.setHead(100);  // the consumer claims to have read entries that were never written
    // The producer trusts its cached head until the ring looks full, then checks the real one.
    uint64_t pushed = 4;
    while (prod.push(makeEntry(pushed))) {
        ++pushed;
    }
    EXPECT_EQ(pushed, kDepth);
    expectProducerDead(ring, prod);
}

TEST(SpscRing, ProducerFlagsHeadFarBehind) {
    GuardedRing<Entry> ring(kDepth);
    auto prod = ring.producer();
    auto cons = ring.consumer();
    for (uint64_t i = 0; i < kDepth; ++i) {
        ASSERT_TRUE(prod.push(makeEntry(i)));
    }
    prod.publish();
    Entry e{};
    for (int i = 0; i < 4; ++i) {
        ASSERT_TRUE(cons.pop(e));
    }
    for (uint64_t i = kDepth; i < kDepth + 4; ++i) {
        ASSERT_TRUE(prod.push(makeEntry(i)));  // tail 20
    }
    ring.setHead(2);  // tail - head = 18 > depth: a head the consumer cannot have stored
    EXPECT_FALSE(prod.push(makeEntry(20)));
    expectProducerDead(ring, prod);
}

TEST(SpscRing, InFlightChecksTheHeadToo) {
    GuardedRing<Entry> ring(kDepth);
    auto prod = ring.producer();
    ASSERT_TRUE(prod.push(makeEntry(0)));
    prod.publish();
    ring.setHead(std::numeric_limits<uint64_t>::max());
    (void)prod.inFlight();
    expectProducerDead(ring, prod);
}

// check() looks at the head at once, without waiting for the ring to look full.
TEST(SpscRing, ProducerCheckValidatesTheHeadNow) {
    GuardedRing<Entry> ring(kDepth);
    auto prod = ring.producer();
    auto cons = ring.consumer();
    ASSERT_TRUE(prod.push(makeEntry(0)));
    ASSERT_TRUE(prod.push(makeEntry(1)));
    prod.publish();
    EXPECT_TRUE(prod.check());
    Entry e{};
    ASSERT_TRUE(cons.pop(e));
    EXPECT_TRUE(prod.check());
    EXPECT_EQ(prod.inFlight(), 1u);
    ring.setHead(3);  // ahead of the tail (2)
    EXPECT_FALSE(prod.check());
    EXPECT_FALSE(prod.check()) << "corruption is sticky";
    expectProducerDead(ring, prod);
}

// Depths other than the default: the mask must cover exactly depth slots.
TEST(SpscRing, LargerDepthsFillExactly) {
    for (uint32_t depth : {16u, 64u, 1024u}) {
        GuardedRing<Entry> ring(depth);
        auto prod = ring.producer();
        auto cons = ring.consumer();
        for (uint64_t lap = 0; lap < 3; ++lap) {
            uint32_t n = 0;
            while (prod.push(makeEntry(lap * depth + n))) {
                ++n;
            }
            ASSERT_EQ(n, depth);
            prod.publish();
            ASSERT_EQ(cons.available(), depth);
            for (uint32_t i = 0; i < depth; ++i) {
                ASSERT_EQ(cons.read(i).seq, lap * depth + i);
            }
            cons.release(depth);
        }
    }
}

}  // namespace
}  // namespace tensorlane::ipc
