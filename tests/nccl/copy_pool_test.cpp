// CopyPool (the NCCL plugin's shadow copies spread over helper threads): every byte lands
// where it belongs, nothing past the end, for sizes around every boundary, with and without
// helpers, from several callers at once; helpers do take parts; destruction joins them.
#include "copy_pool.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

namespace tensorlane::nccl {
namespace {

constexpr size_t kMin = 256 << 10;
constexpr size_t kPart = 64 << 10;
constexpr size_t kGuard = 4096;

/// Copies `bytes` of a numbered pattern into a buffer with guard bytes after it; checks both.
void copyAndCheck(CopyPool &pool, size_t bytes, uint8_t seed) {
    std::vector<uint8_t> from(bytes), to(bytes + kGuard, 0xee);
    for (size_t i = 0; i < bytes; ++i) {
        from[i] = static_cast<uint8_t>(i * 131 + seed + (i >> 12));
    }
    pool.copy(to.data(), from.data(), bytes);
    for (size_t i = 0; i < bytes; ++i) {
        if (to[i] != from[i]) {
            FAIL() << "byte " << i << " of " << bytes << ": " << int(to[i])
                   << " != " << int(from[i]);
        }
    }
    for (size_t i = bytes; i < bytes + kGuard; ++i) {
        if (to[i] != 0xee) {
            FAIL() << "byte " << i - bytes << " past the end of " << bytes << " was written";
        }
    }
}

class CopyPoolSizes : public ::testing::TestWithParam<unsigned> {};

TEST_P(CopyPoolSizes, EveryByteLandsAndNothingPastTheEnd) {
    CopyPool pool(GetParam(), kMin, kPart);
    EXPECT_EQ(pool.threads(), GetParam());
    uint8_t seed = 0;
    for (size_t bytes :
         {size_t{0}, size_t{1}, kPart - 1, kMin - 1, kMin, kMin + 1, size_t{512 << 10},
          size_t{(512 << 10) + 4095}, size_t{3 << 20} + 7, size_t{(16 << 20) + 3}}) {
        SCOPED_TRACE(bytes);
        copyAndCheck(pool, bytes, ++seed);
    }
}

INSTANTIATE_TEST_SUITE_P(Helpers, CopyPoolSizes, ::testing::Values(0u, 1u, 2u, 5u));

TEST(CopyPool, HelpersTakeParts) {
    CopyPool pool(2, kMin, kPart);
    std::vector<uint8_t> from(16 << 20, 1), to(16 << 20);
    // A helper wakes some microseconds after the job is posted; on a loaded machine the caller
    // may finish a copy alone. Over many copies they must take some parts.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (pool.helperParts() == 0 && std::chrono::steady_clock::now() < until) {
        pool.copy(to.data(), from.data(), to.size());
    }
    EXPECT_GT(pool.helperParts(), 0u);
}

TEST(CopyPool, CallersFromSeveralThreadsEachGetTheirOwnBytes) {
    CopyPool pool(2, kMin, kPart);
    std::vector<std::thread> callers;
    for (int t = 0; t < 4; ++t) {
        callers.emplace_back([&pool, t] {
            for (int i = 0; i < 20; ++i) {
                copyAndCheck(pool, (1 << 20) + static_cast<size_t>(t * 4096 + i),
                             uint8_t(t * 50 + i));
            }
        });
    }
    for (std::thread &c : callers) {
        c.join();
    }
}

TEST(CopyPool, GoesAwayWhileItsHelpersWait) {
    for (int i = 0; i < 50; ++i) {
        CopyPool pool(3, kMin, kPart);
        if (i % 2 == 0) {
            copyAndCheck(pool, kMin * 2, uint8_t(i));
        }
    }
}

}  // namespace
}  // namespace tensorlane::nccl
