#include "waiter.hpp"

#include <poll.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <string>

#include "control_channel.hpp"
#include "last_error.hpp"
#include "tensorlane/ipc/doorbell.hpp"

namespace tensorlane::shim {
namespace {

/// tl_wait's and tl_test's detail for a write that failed with `st`.
std::string writeFailure(int32_t st) {
    const Code c = static_cast<Code>(st);
    if (c == Code::kPermission) {
        return "write refused (TL_EPERM): the target's owner does not let this uid write it; "
               "the owner names who may with tl_expose_access";
    }
    if (c == Code::kCuda) {
        return "write failed (TL_ECUDA): the sidecar cannot reach the device memory at one end "
               "(no CUDA in the sidecar, or a dma-buf region, which only the verbs transport "
               "reaches); the sidecar's log says which";
    }
    return std::string("write failed: ") + ipc::codeName(c);
}

}  // namespace

void Waiter::configure(uint32_t poll_mode, uint32_t spin_us, ipc::UniqueFd to_client) {
    to_client_ = std::move(to_client);
    poll_mode_ = poll_mode;
    spin_us_ = spin_us;
    spin_window_us_ = spin_us_;
}

bool Waiter::sidecarGone() {
    if (control_.dead()) {
        return true;
    }
    auto now = std::chrono::steady_clock::now();
    if (now - last_hangup_check_ < std::chrono::milliseconds(1)) {
        return false;
    }
    last_hangup_check_ = now;
    if (control_.hungUp()) {
        control_.markDead("the sidecar went away");
        return true;
    }
    return false;
}

void Waiter::adaptSpin(std::chrono::steady_clock::duration slept, bool woke_with_news) {
    // Adaptive mode's spin window, like KVM's halt polling: a sleep that ended soon with news
    // means spinning a little longer would have caught it without a wake-up (which costs tens
    // to hundreds of microseconds on a busy or virtual machine), so the window grows toward
    // twice that sleep; a long or empty sleep means the client is idle, so it falls back to
    // spin_us and the idle cost stays what the configuration says.
    constexpr int64_t kMaxWindowUs = 1000;
    constexpr int64_t kShortSleepUs = 2000;
    const int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(slept).count();
    if (woke_with_news && us < kShortSleepUs) {
        int64_t grown = std::max<int64_t>(2 * spin_window_us_, 2 * us);
        spin_window_us_ = static_cast<uint32_t>(std::min<int64_t>(grown, kMaxWindowUs));
    } else {
        spin_window_us_ = spin_us_;
    }
}

bool Waiter::waitForActivity(std::chrono::steady_clock::time_point deadline) {
    using Clock = std::chrono::steady_clock;
    // Spin first (busy: until the deadline; adaptive: the current window; event: not at all).
    // The clock is read once per 64 looks at the slots, and first after the first 64: a look
    // is a cache hit until the sidecar writes, and on a virtual machine a clock read can cost
    // as much as a third of a whole no-op round trip.
    Clock::time_point spin_until{};
    uint32_t turns = 0;
    while (poll_mode_ != 2) {
        for (int i = 0; i < 64; ++i) {
            if (rings_.changedSince(watch_)) {
                return false;
            }
        }
        const auto now = Clock::now();
        if (turns == 0) {
            spin_until =
                poll_mode_ == 0 ? deadline : now + std::chrono::microseconds(spin_window_us_);
        }
        if (now >= spin_until) {
            break;
        }
        if ((++turns & 0x3f) == 0 && control_.hungUp()) {
            return true;
        }
    }
    if (poll_mode_ == 0) {
        return false;
    }
    bool hung_up = false;
    ipc::SegmentHeader &header = rings_.header();
    header.client_waiting.value.store(1, std::memory_order_relaxed);
    // SYNC POINT: seq_cst fence between raising client_waiting and re-reading the slots; pairs
    // with the fence in the sidecar's Session::publish() (Dekker).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!rings_.changedSince(watch_)) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
        int timeout = static_cast<int>(std::clamp<int64_t>(left.count() + 1, 0, 1000));
        pollfd p[2] = {{to_client_.get(), POLLIN, 0}, {control_.fd(), POLLRDHUP, 0}};
        auto slept_from = Clock::now();
        ::poll(p, 2, timeout);
        if (p[0].revents & POLLIN) {
            ipc::drain(to_client_.get());
        }
        hung_up = (p[1].revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0;
        if (poll_mode_ == 1) {
            adaptSpin(Clock::now() - slept_from, rings_.changedSince(watch_));
        }
    }
    header.client_waiting.value.store(0, std::memory_order_relaxed);
    return hung_up;
}

void Waiter::waitTurn(std::unique_lock<std::mutex> &lock,
                      std::chrono::steady_clock::time_point deadline) {
    using Clock = std::chrono::steady_clock;
    if (polling_) {
        // Another thread sleeps on the doorbell; it wakes us when it has drained news.
        comp_cv_.wait_until(lock,
                            std::min(deadline, Clock::now() + std::chrono::milliseconds(100)));
        return;
    }
    polling_ = true;
    watch_ = rings_.watch();
    lock.unlock();
    bool hung_up = waitForActivity(deadline);
    lock.lock();
    if (hung_up) {
        control_.markDead("the sidecar went away");
    }
    polling_ = false;
    comp_cv_.notify_all();
}

tl_status Waiter::wait(tl_ticket t, int timeout_ms) {
    using Clock = std::chrono::steady_clock;
    const auto deadline = timeout_ms < 0 ? Clock::time_point::max()
                                         : Clock::now() + std::chrono::milliseconds(timeout_ms);
    std::unique_lock lock(rings_.mutex());
    TicketTable &tickets = rings_.tickets();
    bool first = true;
    for (;;) {
        // The table first: after one drain, a batch's other tickets are already there and
        // need no look at shared memory.
        int32_t st = tickets.state(t);
        if (st == TicketTable::kPending) {
            rings_.drainLocked();
            st = tickets.state(t);
        }
        if (st == TicketTable::kUnknown) {
            return fail(Code::kNotFound, "tl_wait: unknown ticket " + std::to_string(t) +
                                             " (never issued, or already waited for)");
        }
        if (st != TicketTable::kPending) {
            tickets.erase(t);
            return st == 0 ? TL_OK : fail(static_cast<Code>(st), writeFailure(st));
        }
        // An endless wait skips this before its first turn: the polling thread watches the
        // socket too, and the clock read in sidecarGone() would sit between submitting and
        // looking for the completion. A wait with a timeout (a tl_wait(t, 0) poll loop) must
        // see a dead sidecar on every call.
        if ((!first || timeout_ms >= 0) && sidecarGone()) {
            rings_.failPendingLocked(static_cast<int32_t>(Code::kConnection));
            continue;
        }
        first = false;
        if (deadline != Clock::time_point::max() && Clock::now() >= deadline) {
            return fail(Code::kTimedOut, "tl_wait: ticket " + std::to_string(t) + " pending");
        }
        waitTurn(lock, deadline);
    }
}

tl_status Waiter::test(tl_ticket t, int *done) {
    if (!done) {
        return fail(Code::kInvalid, "tl_test: done is NULL");
    }
    std::unique_lock lock(rings_.mutex());
    TicketTable &tickets = rings_.tickets();
    int32_t st = tickets.state(t);
    if (st == TicketTable::kPending) {
        rings_.drainLocked();
        st = tickets.state(t);
    }
    if (st == TicketTable::kUnknown) {
        return fail(Code::kNotFound, "tl_test: unknown ticket " + std::to_string(t));
    }
    if (st == TicketTable::kPending) {
        if (sidecarGone()) {
            rings_.failPendingLocked(static_cast<int32_t>(Code::kConnection));
            st = static_cast<int32_t>(Code::kConnection);
        } else {
            *done = 0;
            return TL_OK;
        }
    }
    tickets.erase(t);
    *done = 1;
    return st == 0 ? TL_OK : fail(static_cast<Code>(st), writeFailure(st));
}

tl_status Waiter::waitNotification(tl_notification *out, int timeout_ms) {
    if (!out) {
        return fail(Code::kInvalid, "tl_wait_notification: out is NULL");
    }
    return takeNote(timeout_ms, "tl_wait_notification",
                    [out](const tl_message &m) { *out = m.ex.n; });
}

tl_status Waiter::waitNotificationEx(tl_notification_ex *out, int timeout_ms) {
    if (!out) {
        return fail(Code::kInvalid, "tl_wait_notification_ex: out is NULL");
    }
    return takeNote(timeout_ms, "tl_wait_notification_ex",
                    [out](const tl_message &m) { *out = m.ex; });
}

tl_status Waiter::waitMessage(tl_message *out, int timeout_ms) {
    if (!out) {
        return fail(Code::kInvalid, "tl_wait_message: out is NULL");
    }
    return takeNote(timeout_ms, "tl_wait_message", [out](const tl_message &m) {
        // The payload as far as it goes; the rest of the array is left as it was.
        std::memcpy(static_cast<void *>(out), &m, offsetof(tl_message, payload));
        std::memcpy(out->payload, m.payload, m.payload_bytes);
    });
}

template <class Take>
tl_status Waiter::takeNote(int timeout_ms, const char *what, Take &&take) {
    using Clock = std::chrono::steady_clock;
    const auto deadline = timeout_ms < 0 ? Clock::time_point::max()
                                         : Clock::now() + std::chrono::milliseconds(timeout_ms);
    std::unique_lock lock(rings_.mutex());
    std::deque<tl_message> &notes = rings_.notes();
    for (;;) {
        rings_.drainLocked();
        if (!notes.empty()) {
            take(notes.front());
            notes.pop_front();
            return TL_OK;
        }
        if (sidecarGone()) {
            return fail(Code::kConnection, "sidecar connection lost: " + control_.deadReason());
        }
        if (Clock::now() >= deadline) {
            return fail(Code::kTimedOut, std::string(what) + ": nothing arrived");
        }
        waitTurn(lock, deadline);
    }
}

}  // namespace tensorlane::shim
