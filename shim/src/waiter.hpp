// Waiting for what the rings bring: tl_wait and tl_test on a ticket, tl_wait_notification.
// One waiting thread at a time polls the rings and sleeps on the client's doorbell (spinning
// first, as the sidecar's poll mode says); the others sleep on a condition variable until it
// has drained what arrived. The state here is guarded by the rings' lock.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "rings.hpp"
#include "tensorlane/ipc/fd.hpp"
#include "tensorlane/tensorlane.h"

namespace tensorlane::shim {

class ControlChannel;

class Waiter {
public:
    /// Both outlive the waiter.
    Waiter(ControlChannel &control, Rings &rings) : control_(control), rings_(rings) {}

    /// The sidecar's poll mode (0 busy, 1 adaptive, 2 event) and spin, and the client's
    /// doorbell, from its greeting.
    void configure(uint32_t poll_mode, uint32_t spin_us, ipc::UniqueFd to_client);

    tl_status wait(tl_ticket t, int timeout_ms);
    tl_status test(tl_ticket t, int *done);
    tl_status waitNotification(tl_notification *out, int timeout_ms);
    tl_status waitNotificationEx(tl_notification_ex *out, int timeout_ms);
    tl_status waitMessage(tl_message *out, int timeout_ms);

    /// Wakes every thread waiting on the condition variable (the rings' lock held): something
    /// other than the rings ended their wait (the keeper saw the sidecar go).
    void wakeAllLocked() { comp_cv_.notify_all(); }

private:
    /// Takes the oldest notification into `take` (a copy into the caller's struct), waiting up
    /// to `timeout_ms` for one.
    template <class Take>
    tl_status takeNote(int timeout_ms, const char *what, Take &&take);
    /// Blocks until the rings may have news, the sidecar goes away, or `deadline` passes.
    /// Returns true when the sidecar hung up.
    bool waitForActivity(std::chrono::steady_clock::time_point deadline);
    /// The connection is dead, or a hang-up is seen on the socket; the syscall runs at most
    /// once a millisecond so a polling tl_test loop stays cheap (the rings' lock held).
    bool sidecarGone();
    /// One turn of waiting (the rings' lock held via `lock`): the first waiter sleeps on the
    /// doorbell, the others on comp_cv_ until it has drained what arrived.
    void waitTurn(std::unique_lock<std::mutex> &lock,
                  std::chrono::steady_clock::time_point deadline);
    /// Grows or resets the adaptive spin window after a sleep (the polling thread only).
    void adaptSpin(std::chrono::steady_clock::duration slept, bool woke_with_news);

    ControlChannel &control_;
    Rings &rings_;
    ipc::UniqueFd to_client_;
    uint32_t poll_mode_ = 1;
    uint32_t spin_us_ = 50;
    uint32_t spin_window_us_ = 50;  ///< adaptive mode's current spin (only the poller uses it)

    std::condition_variable comp_cv_;
    bool polling_ = false;  ///< one thread sleeps on the doorbell, the others on comp_cv_
    std::chrono::steady_clock::time_point last_hangup_check_{};
    /// The next completion and notification slots as waitTurn() saw them (polling_ thread
    /// only).
    Rings::Watch watch_;
};

}  // namespace tensorlane::shim
