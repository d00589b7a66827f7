// A completion queue: a ring of ibv_wc filled by the engine and by posting threads, drained by
// ibv_poll_cq() or the extended start_poll/next_poll/end_poll API (ibv_create_cq_ex(3)).
#pragma once

#include <atomic>
#include <mutex>
#include <vector>

#include "handles.hpp"

namespace tensorlane::simhca {

/// One CQ.
class SimCq {
public:
    /// A CQ of at least cqe entries on ctx, notifying channel (may be null).
    SimCq(SimContext *ctx, int cqe, CompChannel *channel, void *cq_context, uint64_t wc_flags);
    ~SimCq();
    SimCq(const SimCq &) = delete;
    SimCq &operator=(const SimCq &) = delete;

    /// As ibv_cq.
    [[nodiscard]] ibv_cq *ibv() { return ibv_cq_ex_to_cq(&handle_.ibv); }
    /// As ibv_cq_ex.
    [[nodiscard]] ibv_cq_ex *ibvEx() { return &handle_.ibv; }
    /// The CQ behind an ibv_cq this library handed out.
    [[nodiscard]] static SimCq *from(ibv_cq *cq) { return handleOf<CqHandle>(cq)->self; }
    /// Adds a completion. False when the CQ is full: the completion is lost, the CQ is in error
    /// and IBV_EVENT_CQ_ERR was queued (IB spec 11.4.2.1: CQ overrun).
    [[nodiscard]] bool push(const ibv_wc &wc, bool solicited);
    /// ibv_poll_cq().
    [[nodiscard]] int poll(int n, ibv_wc *wc);
    /// ibv_req_notify_cq(): the next completion (or next solicited one) queues an event.
    [[nodiscard]] int arm(bool solicited_only);
    /// Entries the CQ holds (ibv_cq::cqe).
    [[nodiscard]] int capacity() const { return static_cast<int>(ring_.size()); }
    /// ibv_resize_cq(): grows or shrinks; EINVAL when the entries in it would not fit.
    [[nodiscard]] int resize(int cqe);
    /// The channel, if any.
    [[nodiscard]] CompChannel *channel() const { return channel_; }

    /// Extended polling: start (locks the CQ until endPoll), next, end; the current entry.
    [[nodiscard]] int startPoll();
    /// Moves to the next entry; ENOENT when there is none.
    [[nodiscard]] int nextPoll();
    /// Ends a poll batch.
    void endPoll();
    /// The entry read_* return.
    [[nodiscard]] const ibv_wc &current() const { return current_; }

private:
    bool popLocked(ibv_wc &out);

    SimContext *ctx_;
    CompChannel *channel_;
    std::mutex mutex_;
    std::vector<ibv_wc> ring_;
    size_t head_ = 0;
    size_t count_ = 0;
    // SYNC POINT: a copy of count_ read without the lock by pollers, so an empty poll (the
    // common case for a busy-polling application) never takes the mutex the engine needs to
    // add a completion. Written under the lock with release; read with acquire.
    std::atomic<size_t> available_{0};
    int armed_ = 0;  ///< 0 not armed, 1 next completion, 2 next solicited completion
    bool overrun_ = false;
    ibv_wc current_{};
    CqHandle handle_{};
};

}  // namespace tensorlane::simhca
