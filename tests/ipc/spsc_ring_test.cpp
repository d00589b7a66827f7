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

// The consumer never reads the producer's tail cursor: whatever it says, only published slots
// are taken (publication is the slot's sequence word).
TEST(SpscRing, ConsumerIgnoresTheTailCursor) {
    for (uint64_t bogus :
         {uint64_t{kDepth}, uint64_t{kDepth} + 1, uint64_t{1} << 40,
          std::numeric_limits<uint64_t>::max() - 5, uint64_t{0xdeadbeefdeadbeef}}) {
        GuardedRing<Entry> ring(kDepth);
        auto prod = ring.producer();
        auto cons = ring.consumer();
        ring.setTail(bogus);
        Entry e{};
        EXPECT_EQ(cons.available(), 0u) << "tail " << bogus;
        EXPECT_FALSE(cons.pop(e));
        for (uint64_t i = 0; i < 3; ++i) {
            ASSERT_TRUE(prod.push(makeEntry(i)));
        }
        prod.publish();
        ring.setTail(bogus);  // after an honest publish too
        ASSERT_EQ(cons.available(), 3u) << "tail " << bogus;
        for (uint64_t i = 0; i < 3; ++i) {
            ASSERT_TRUE(cons.pop(e));
            EXPECT_EQ(e.seq, i);
            EXPECT_TRUE(entryIsIntact(e));
        }
        EXPECT_EQ(cons.available(), 0u);
    }
}

// A slot is taken only when its word is exactly the next position + 1: zero (never written), the
// previous or next lap's number, off by one, or garbage leave it unread.
TEST(SpscRing, ConsumerTakesOnlyTheExpectedSequenceWord) {
    GuardedRing<Entry> ring(kDepth);
    auto prod = ring.producer();
    auto cons = ring.consumer();
    // Move the head to the middle of the second lap so "previous lap" is a real position.
    Entry e{};
    for (uint64_t i = 0; i < kDepth + 5; ++i) {
        ASSERT_TRUE(prod.push(makeEntry(i)));
        prod.publish();
        ASSERT_TRUE(cons.pop(e));
    }
    const uint64_t pos = cons.head();
    ASSERT_EQ(pos, kDepth + 5);
    for (uint64_t word : {uint64_t{0}, pos, pos + 2, pos + 1 - kDepth, pos + 1 + kDepth,
                          std::numeric_limits<uint64_t>::max()}) {
        ring.setSlotSeq(pos, word);
        EXPECT_EQ(cons.available(), 0u) << "word " << word;
        EXPECT_FALSE(cons.pop(e));
    }
    // A forged but well-numbered word is an entry: the caller validates what it copies out,
    // and read() reports the position, not the word in shared memory.
    ring.setSlotSeq(pos, pos + 1);
    ASSERT_EQ(cons.available(), 1u);
    EXPECT_EQ(cons.read(0).ring_seq, pos + 1);
}

// Counting published slots stops at the first gap and never exceeds the depth, even when a
// hostile producer marks every slot (and more) published.
TEST(SpscRing, ConsumerCountsOnlyConsecutiveSlotsUpToDepth) {
    GuardedRing<Entry> ring(kDepth);
    auto cons = ring.consumer();
    for (uint64_t p = 0; p < 5; ++p) {
        ring.setSlotSeq(p, p + 1);
    }
    ring.setSlotSeq(6, 7);  // position 5 missing
    EXPECT_EQ(cons.available(), 5u);
    cons.release(5);
    EXPECT_EQ(cons.available(), 0u);
    for (uint64_t p = 0; p < 3 * kDepth; ++p) {
        ring.setSlotSeq(p, p + 1);  // each slot ends with its third-lap number
    }
    EXPECT_EQ(cons.available(), 0u) << "position 5's slot holds a later lap's number";
    for (uint64_t p = 5; p < 5 + kDepth; ++p) {
        ring.setSlotSeq(p, p + 1);  // every slot published, one lap from the head
    }
    EXPECT_EQ(cons.available(), kDepth) << "one lap at most";
    cons.release(kDepth);
    EXPECT_EQ(cons.available(), 0u);
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
