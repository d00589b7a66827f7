// Stress tests of the SPSC ring with two threads: millions of entries through a depth-16 ring,
// single and batched publication, and peers that publish bogus cursors at random moments.
// Sized by TENSORLANE_STRESS_ITERS (entries per test); the default shrinks under sanitizers.
// Meant to run clean under ThreadSanitizer and AddressSanitizer.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <thread>

#include "tensorlane/ipc/spsc_ring.hpp"
#include "test_support.hpp"

namespace tensorlane::ipc {
namespace {

using test::Entry;
using test::entryIsIntact;
using test::GuardedRing;
using test::makeEntry;
using test::peekSeq;
using test::stressIterations;
using test::touchPushed;

constexpr uint32_t kStressDepth = 16;
constexpr auto kDeadline = std::chrono::seconds(60);  // a hang fails instead of stalling CI

/// Spins a little, then yields: two spinning threads on two cores (or fewer) still progress.
class Backoff {
public:
    void pause() {
        if (++spins_ < 64) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        } else {
            std::this_thread::yield();
        }
    }
    void reset() {
        spins_ = 0;
    }

private:
    int spins_ = 0;
};

bool pastDeadline(std::chrono::steady_clock::time_point start) {
    return std::chrono::steady_clock::now() - start > kDeadline;
}

/// Consumes `count` entries in order, checking each; returns "" or the first problem.
/// `batch_reads` mixes pop() with available()/read()/release() batches.
std::string consumeAll(RingConsumer<Entry> &cons, const Entry *slots, uint64_t count,
                       bool batch_reads) {
    std::mt19937_64 rng(7);
    Backoff backoff;
    const auto start = std::chrono::steady_clock::now();
    uint64_t expected = 0;
    while (expected < count) {
        const uint32_t n = cons.available();
        if (n > cons.depth()) {
            return "available() = " + std::to_string(n) + " exceeds the depth";
        }
        if (n == 0) {
            if (pastDeadline(start)) {
                return "consumer timed out at entry " + std::to_string(expected);
            }
            backoff.pause();
            continue;
        }
        backoff.reset();
        if (!batch_reads || (rng() & 1)) {
            const uint64_t peeked = peekSeq(slots, kStressDepth, cons.head());
            Entry e;
            if (!cons.pop(e)) {
                return "pop failed with entries available";
            }
            if (e.seq != expected || peeked != expected || !entryIsIntact(e)) {
                return "entry " + std::to_string(expected) + " arrived as seq " +
                       std::to_string(e.seq) + (entryIsIntact(e) ? "" : " (torn)");
            }
            ++expected;
            continue;
        }
        const uint32_t take = 1 + static_cast<uint32_t>(rng() % n);
        for (uint32_t i = 0; i < take; ++i) {
            const Entry e = cons.read(i);
            if (e.seq != expected + i || peekSeq(slots, kStressDepth, cons.head() + i) != e.seq ||
                !entryIsIntact(e)) {
                return "entry " + std::to_string(expected + i) + " arrived as seq " +
                       std::to_string(e.seq) + (entryIsIntact(e) ? "" : " (torn)");
            }
        }
        cons.release(take);
        expected += take;
    }
    return "";
}

void runProducerConsumer(bool batch_push) {
    GuardedRing<Entry> ring(kStressDepth);
    const uint64_t count = stressIterations(2'000'000);
    std::atomic<bool> stop{false};
    std::string producer_error;

    std::thread producer([&] {
        auto prod = ring.producer();
        std::mt19937_64 rng(42);
        Backoff backoff;
        const auto start = std::chrono::steady_clock::now();
        uint64_t next = 0;
        while (next < count && !stop.load(std::memory_order_relaxed)) {
            // Batch mode: push up to k, then publish them all at once.
            const uint64_t want = batch_push ? 1 + rng() % kStressDepth : 1;
            uint64_t pushed = 0;
            while (pushed < want && next < count && prod.push(makeEntry(next))) {
                touchPushed(ring.slots(), kStressDepth, prod.tail(), next);
                ++next;
                ++pushed;
            }
            if (pushed > 0) {
                prod.publish();
                backoff.reset();
                continue;
            }
            if (prod.corrupt()) {
                producer_error = "honest consumer flagged corrupt at entry " + std::to_string(next);
                return;
            }
            if (pastDeadline(start)) {
                producer_error = "producer timed out at entry " + std::to_string(next);
                return;
            }
            backoff.pause();
        }
    });

    auto cons = ring.consumer();
    const std::string consumer_error = consumeAll(cons, ring.slots(), count, batch_push);
    stop.store(true, std::memory_order_relaxed);
    producer.join();
    EXPECT_EQ(producer_error, "");
    EXPECT_EQ(consumer_error, "");
    EXPECT_EQ(cons.head(), count);
    EXPECT_EQ(ring.sharedTail(), count);
    EXPECT_EQ(cons.available(), 0u);
}

TEST(SpscRingStress, TwoThreadsKeepOrderAndPayload) {
    runProducerConsumer(false);
}

TEST(SpscRingStress, BatchPushThenPublish) {
    runProducerConsumer(true);
}

/// A bogus cursor value that no honest peer can have written, given the other side's position.
/// `behind_limit`: every value below it is illegal; `ahead_limit`: every value above it is.
uint64_t bogusCursor(std::mt19937_64 &rng, uint64_t behind_limit, uint64_t ahead_limit) {
    switch (rng() % 3) {
        case 0:
            if (behind_limit > 0) {
                return rng() % behind_limit;
            }
            [[fallthrough]];
        case 1:
            return ahead_limit + 1 + rng() % 100000;
        default:
            return rng() | (uint64_t{1} << 63);
    }
}

// A producer publishes honest entries while another thread keeps storing tails that no honest
// producer can have written (behind the consumer, far ahead, garbage). The consumer polls the
// slots' sequence words and never the tail: it must read every honest entry once, in order and
// intact, and nothing more.
TEST(SpscRingStress, ConsumerIgnoresBogusTails) {
    const uint64_t rounds = std::max<uint64_t>(20, stressIterations(2'000'000) / 2000);
    std::mt19937_64 seeds(1234);
    for (uint64_t round = 0; round < rounds; ++round) {
        GuardedRing<Entry> ring(kStressDepth);
        const uint64_t seed = seeds();
        const uint64_t honest = 1 + seed % 3000;
        std::atomic<bool> stop{false};
        std::string producer_error;
        // Attached before the scribbler starts: a producer takes its tail from shared memory.
        auto prod = ring.producer();

        std::thread producer([&] {
            std::mt19937_64 rng(seed);
            Backoff backoff;
            const auto start = std::chrono::steady_clock::now();
            uint64_t next = 0;
            while (next < honest) {
                if (stop.load(std::memory_order_relaxed)) {
                    return;
                }
                if (prod.push(makeEntry(next))) {
                    touchPushed(ring.slots(), kStressDepth, prod.tail(), next);
                    ++next;
                    if (rng() % 4 == 0 || next == honest) {
                        prod.publish();
                    }
                    backoff.reset();
                    continue;
                }
                prod.publish();
                if (pastDeadline(start)) {
                    producer_error = "producer timed out";
                    return;
                }
                backoff.pause();
            }
        });
        std::thread scribbler([&] {
            std::mt19937_64 rng(seed ^ 0x5555);
            while (!stop.load(std::memory_order_relaxed)) {
                ring.setTail(
                    bogusCursor(rng, ring.sharedHead(), ring.sharedHead() + 2 * kStressDepth));
                std::this_thread::yield();
            }
        });

        auto cons = ring.consumer();
        const std::string consumer_error = consumeAll(cons, ring.slots(), honest, true);
        producer.join();
        const uint32_t extra = cons.available();
        stop.store(true, std::memory_order_relaxed);
        scribbler.join();
        ASSERT_EQ(producer_error, "") << "round " << round;
        ASSERT_EQ(consumer_error, "") << "round " << round;
        ASSERT_EQ(extra, 0u) << "round " << round << ": read past the last honest entry";
    }
}

// The mirror image: a consumer reads honestly, then stores a head it cannot have reached (ahead
// of anything written, or more than depth behind). The producer must flag corrupt() before it
// overwrites a slot the consumer has not released.
TEST(SpscRingStress, ProducerFlagsBogusHeads) {
    const uint64_t rounds = std::max<uint64_t>(20, stressIterations(2'000'000) / 2000);
    std::mt19937_64 seeds(4321);
    for (uint64_t round = 0; round < rounds; ++round) {
        GuardedRing<Entry> ring(kStressDepth);
        const uint64_t seed = seeds();
        const uint64_t honest = seed % 3000;
        std::string producer_error;
        uint64_t produced = 0;

        std::thread producer([&] {
            auto prod = ring.producer();
            Backoff backoff;
            const auto start = std::chrono::steady_clock::now();
            uint64_t next = 0;
            for (;;) {
                if (next > honest + kStressDepth) {
                    // The consumer releases `honest` entries and no more: a tail beyond
                    // honest + depth means a slot it never released was overwritten.
                    producer_error = "pushed past the consumer's head + depth";
                    break;
                }
                if (prod.push(makeEntry(next))) {
                    touchPushed(ring.slots(), kStressDepth, prod.tail(), next);
                    ++next;
                    prod.publish();
                    backoff.reset();
                    continue;
                }
                if (prod.corrupt()) {
                    break;
                }
                if (pastDeadline(start)) {
                    producer_error = "bogus head never flagged (or producer stuck)";
                    break;
                }
                backoff.pause();
            }
            if (prod.freeSlots() != 0 || prod.push(makeEntry(next))) {
                producer_error = "a corrupt producer still pushes";
            }
            produced = prod.tail();
        });

        auto cons = ring.consumer();
        std::mt19937_64 rng(seed);
        Backoff backoff;
        const auto start = std::chrono::steady_clock::now();
        std::string consumer_error;
        uint64_t expected = 0;
        while (expected < honest) {
            Entry e;
            const uint64_t peeked =
                cons.available() > 0 ? peekSeq(ring.slots(), kStressDepth, cons.head()) : expected;
            if (!cons.pop(e)) {
                if (pastDeadline(start)) {
                    consumer_error = "consumer timed out";
                    break;
                }
                backoff.pause();
                continue;
            }
            backoff.reset();
            if (e.seq != expected || peeked != expected || !entryIsIntact(e)) {
                consumer_error = "bad entry at " + std::to_string(expected);
                break;
            }
            ++expected;
        }
        // Our head is `expected`; the producer's tail is at most expected + depth.
        const uint64_t bogus = bogusCursor(
            rng, expected > kStressDepth ? expected - kStressDepth : 0, expected + kStressDepth);
        ring.setHead(bogus);
        // The producer fills the free slots, looks at the head, and must give up (its deadline
        // bounds the wait if it never does).
        producer.join();
        ASSERT_EQ(consumer_error, "") << "round " << round;
        ASSERT_EQ(producer_error, "") << "round " << round << " bogus head " << bogus;
        // The producer wrote at most the slots the consumer had released: the entries from our
        // head to its tail are all still there, in order, unharmed.
        ASSERT_LE(produced, expected + kStressDepth);
        for (uint64_t s = expected; s < produced; ++s) {
            const Entry slot = ring.slots()[s & (kStressDepth - 1)];
            ASSERT_EQ(slot.seq, s) << "round " << round;
            ASSERT_TRUE(entryIsIntact(slot));
        }
    }
}

}  // namespace
}  // namespace tensorlane::ipc
