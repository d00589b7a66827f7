// Cross-process test of the session segment: a forked child maps the segment through its fd and
// plays the client (producer of requests, consumer of completions) while this process plays the
// sidecar. Both sides use the doorbell protocol of layout.hpp: spin a while, then raise their
// "sleeping" flag, fence, re-check the ring, and sleep on an eventfd; the other side publishes,
// fences, and rings the doorbell only when the flag is up. A lost wake-up shows as a poll that
// times out (and, as a last resort, as the watchdog alarm).
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <new>
#include <string>

#include "tensorlane/ipc/doorbell.hpp"
#include "tensorlane/ipc/layout.hpp"
#include "tensorlane/ipc/shm.hpp"
#include "tensorlane/ipc/status.hpp"

// ThreadSanitizer does not model std::atomic_thread_fence and GCC warns about every use; the two
// sides here are separate processes, which TSan does not see anyway.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic ignored "-Wtsan"
#endif

namespace tensorlane::ipc {
namespace {

constexpr uint32_t kCrossDepth = 16;
constexpr int kPollTimeoutMs = 10000;  // far longer than any honest wait in this test
constexpr unsigned kWatchdogSeconds = 120;

/// Counters both processes update, in a MAP_SHARED anonymous page inherited across fork().
struct SharedStats {
    std::atomic<uint64_t> client_sleeps;
    std::atomic<uint64_t> client_rings;
    std::atomic<uint64_t> client_completions;
    std::atomic<uint64_t> sidecar_sleeps;
    std::atomic<uint64_t> sidecar_rings;
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

enum ChildExit : int {
    kChildOk = 0,
    kChildMapFailed = 10,
    kChildInvalidSegment = 11,
    kChildBadCompletion = 12,
    kChildLostWakeup = 13,
    kChildCorrupt = 14,
    kChildPollError = 15,
};

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

/// Whether a counter that went from `before` to `after` passed a multiple of `period`.
constexpr bool crossed(uint64_t before, uint64_t after, uint64_t period) {
    return before / period != after / period;
}

/// Sleeps on `doorbell` after raising `flag`, unless `ready()` turns true after the flag is up.
/// Returns 0 (woke or did not need to sleep), ETIMEDOUT (a lost wake-up) or an errno value.
template <class Ready>
int sleepOnDoorbell(DoorbellFlag &flag, int doorbell, Ready ready, bool *slept) {
    *slept = false;
    flag.value.store(1, std::memory_order_relaxed);
    // SYNC POINT: the flag store and the re-check below are separated by a full fence; the
    // other side stores its cursor, fences, then loads our flag. Of the two loads at least one
    // sees the other side's store, so either we see the new entries or it rings us.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    int rc = 0;
    if (!ready()) {
        pollfd p{doorbell, POLLIN, 0};
        int n;
        do {
            n = ::poll(&p, 1, kPollTimeoutMs);
        } while (n < 0 && errno == EINTR);
        if (n == 0) {
            rc = ETIMEDOUT;
        } else if (n < 0) {
            rc = errno;
        }
        *slept = true;
    }
    flag.value.store(0, std::memory_order_relaxed);
    drain(doorbell);
    return rc;
}

/// After publishing: ring the other side if its flag says it sleeps (or is about to).
void wakeIfSleeping(DoorbellFlag &flag, int doorbell, std::atomic<uint64_t> &rings) {
    // SYNC POINT: pairs with the fence in sleepOnDoorbell (see there).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (flag.value.load(std::memory_order_relaxed) != 0) {
        ring(doorbell);
        rings.fetch_add(1, std::memory_order_relaxed);
    }
}

/// The client, in the child process. Returns a ChildExit code.
int clientMain(int seg_fd, int to_sidecar, int to_client, uint64_t count, int spin,
               SharedStats *stats) {
    ::alarm(kWatchdogSeconds);
    const uint64_t bytes = segmentSize(seg_fd);
    Mapping m;
    if (bytes == 0 || mapSegment(seg_fd, bytes, &m) != 0) {
        return kChildMapFailed;
    }
    SegmentGeometry g;
    if (!validateSegment(m.data(), bytes, &g) || g.request_depth != kCrossDepth) {
        return kChildInvalidSegment;
    }
    SegmentView v = SegmentView::at(m.data(), g);
    RingProducer<Request> requests(v.request_ctl, v.requests, g.request_depth);
    RingConsumer<Completion> completions(v.completion_ctl, v.completions, g.completion_depth);

    uint64_t next_ticket = 1;
    uint64_t next_done = 1;
    int idle = 0;
    while (next_done <= count) {
        bool progressed = false;
        uint32_t pushed = 0;
        while (next_ticket <= count) {
            Request r{};
            r.op = static_cast<uint32_t>(Op::kNop);
            r.ticket = next_ticket;
            r.imm = static_cast<uint32_t>(next_ticket * 7);
            r.bytes = next_ticket * 3;
            if (!requests.push(r)) {
                break;
            }
            ++next_ticket;
            ++pushed;
        }
        if (pushed > 0) {
            requests.publish();
            wakeIfSleeping(v.header->sidecar_sleeping, to_sidecar, stats->client_rings);
            progressed = true;
        }
        const uint32_t n = completions.available();
        for (uint32_t i = 0; i < n; ++i) {
            const Completion c = completions.read(i);  // a copy: validate that, not the slot
            if (c.ticket != next_done || c.status != static_cast<int32_t>(Code::kOk) ||
                c.bytes != next_done * 3) {
                return kChildBadCompletion;
            }
            ++next_done;
        }
        if (n > 0) {
            completions.release(n);
            stats->client_completions.fetch_add(n, std::memory_order_relaxed);
            progressed = true;
        }
        if (requests.corrupt()) {
            return kChildCorrupt;
        }
        // Now and then the client is busy elsewhere, so the sidecar runs dry and sleeps.
        if (crossed(next_done - n, next_done, 4096)) {
            ::usleep(300);
        }
        if (progressed) {
            idle = 0;
            continue;
        }
        if (idle++ < spin) {
            cpuRelax();
            continue;
        }
        idle = 0;
        bool slept = false;
        int rc = sleepOnDoorbell(
            v.header->client_waiting, to_client, [&] { return completions.available() > 0; },
            &slept);
        if (rc == ETIMEDOUT) {
            return kChildLostWakeup;
        }
        if (rc != 0) {
            return kChildPollError;
        }
        if (slept) {
            stats->client_sleeps.fetch_add(1, std::memory_order_relaxed);
        }
    }
    return kChildOk;
}

/// The sidecar, in this process: answers every request in order. Returns "" or what went wrong.
std::string sidecarLoop(const SegmentView &v, int to_sidecar, int to_client, uint64_t count,
                        int spin, SharedStats *stats) {
    RingConsumer<Request> requests(v.request_ctl, v.requests, kCrossDepth);
    RingProducer<Completion> completions(v.completion_ctl, v.completions, kCrossDepth);
    uint64_t expected = 1;
    int idle = 0;
    while (expected <= count) {
        const uint32_t n = requests.available();
        uint32_t handled = 0;
        while (handled < n && completions.freeSlots() > 0) {
            const Request r = requests.read(handled);  // copy out, then validate
            if (r.ticket != expected || r.op != static_cast<uint32_t>(Op::kNop) ||
                r.bytes != expected * 3 || r.imm != static_cast<uint32_t>(expected * 7)) {
                return "request " + std::to_string(expected) + " arrived as ticket " +
                       std::to_string(r.ticket);
            }
            Completion c{};
            c.ticket = r.ticket;
            c.status = static_cast<int32_t>(Code::kOk);
            c.bytes = r.bytes;
            if (!completions.push(c)) {
                return "completion push failed with free slots";
            }
            ++handled;
            ++expected;
        }
        if (completions.corrupt()) {
            return "a ring was flagged corrupt";
        }
        if (handled > 0) {
            requests.release(handled);
            completions.publish();
            wakeIfSleeping(v.header->client_waiting, to_client, stats->sidecar_rings);
            idle = 0;
            // Now and then the sidecar is slow, so the client waits and sleeps.
            if (crossed(expected - handled, expected, 4099)) {
                ::usleep(300);
            }
            continue;
        }
        if (n > 0) {
            // Requests wait but the completion ring is full: the client is awake (it has
            // completions to read) and frees slots without ringing us, so only yield.
            ::sched_yield();
            continue;
        }
        if (idle++ < spin) {
            cpuRelax();
            continue;
        }
        idle = 0;
        bool slept = false;
        int rc = sleepOnDoorbell(
            v.header->sidecar_sleeping, to_sidecar, [&] { return requests.available() > 0; },
            &slept);
        if (rc == ETIMEDOUT) {
            return "lost wake-up: the sidecar slept " + std::to_string(kPollTimeoutMs) +
                   " ms with request " + std::to_string(expected) + " outstanding";
        }
        if (rc != 0) {
            return "poll failed: errno " + std::to_string(rc);
        }
        if (slept) {
            stats->sidecar_sleeps.fetch_add(1, std::memory_order_relaxed);
        }
    }
    return "";
}

void runSession(uint64_t count, int spin) {
    const SegmentGeometry g = SegmentGeometry::forDepth(kCrossDepth);
    SharedSegment seg;
    std::string error;
    ASSERT_EQ(createSegment(g.total_bytes, ::getuid(), ::getgid(), &seg, &error), 0) << error;
    initSegment(seg.mapping.data(), g, 99);
    UniqueFd to_sidecar, to_client;
    ASSERT_EQ(makeEventFd(&to_sidecar), 0);
    ASSERT_EQ(makeEventFd(&to_client), 0);

    void *stats_page = ::mmap(nullptr, sizeof(SharedStats), PROT_READ | PROT_WRITE,
                              MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(stats_page, MAP_FAILED);
    auto *stats = new (stats_page) SharedStats{};

    ::alarm(kWatchdogSeconds);  // watchdog: a hang kills the test binary instead of CI
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        // Only async-signal-safe-ish work and _exit from here: no gtest in the child.
        const int code =
            clientMain(seg.fd.get(), to_sidecar.get(), to_client.get(), count, spin, stats);
        ::_exit(code);
    }

    const SegmentView v = SegmentView::at(seg.mapping.data(), g);
    const std::string failure =
        sidecarLoop(v, to_sidecar.get(), to_client.get(), count, spin, stats);
    if (!failure.empty()) {
        ::kill(child, SIGKILL);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ::alarm(0);
    EXPECT_EQ(failure, "");
    ASSERT_TRUE(WIFEXITED(status)) << "client died by signal " << WTERMSIG(status);
    EXPECT_EQ(WEXITSTATUS(status), kChildOk) << "client exit code (see ChildExit)";
    EXPECT_EQ(stats->client_completions.load(), count) << "every ticket completed once";
    // The sleep path really ran on both sides (thousands of times in practice).
    EXPECT_GT(stats->client_sleeps.load(), 0u);
    EXPECT_GT(stats->sidecar_sleeps.load(), 0u);
    EXPECT_GT(stats->sidecar_rings.load() + stats->client_rings.load(), 0u);
    // Both flags are down once both sides are done.
    EXPECT_EQ(v.header->sidecar_sleeping.value.load(), 0u);
    EXPECT_EQ(v.header->client_waiting.value.load(), 0u);
    ::testing::Test::RecordProperty("client_sleeps", std::to_string(stats->client_sleeps.load()));
    ::testing::Test::RecordProperty("sidecar_sleeps", std::to_string(stats->sidecar_sleeps.load()));
    ::munmap(stats_page, sizeof(SharedStats));
}

// These drive the ring and doorbell primitives with a loop written here that follows the same
// protocol as the engine; the engine's own armSleep and the shim are tested end to end by
// tests/sidecar/limits_test.cpp (Wakeups.*), which count the sidecar's late wake-ups.
TEST(IpcCrossProcess, DekkerProtocolLoopAdaptiveLosesNoWakeup) {
    runSession(500000, 200);
}

// Event mode: no spinning at all, so every idle moment goes through the flag/fence/sleep path.
TEST(IpcCrossProcess, DekkerProtocolLoopEventLosesNoWakeup) {
    runSession(300000, 0);
}

}  // namespace
}  // namespace tensorlane::ipc
