// Lock-free single-producer single-consumer ring over a slot array in shared memory.
//
// The ring lives in memory that the other side can scribble on. Each side therefore keeps its own
// cursor in private memory and only *stores* it to shared memory; the other side's cursor is
// loaded, validated (0 <= tail - head <= depth) and cached. A violation marks the ring corrupt and
// every later call fails: nothing is read past what the cursors allow.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace tensorlane::ipc {

inline constexpr size_t kCacheLine = 64;

/// One cursor, alone on its cache line so producer and consumer never false-share.
struct alignas(kCacheLine) RingCursor {
    std::atomic<uint64_t> value;
};
static_assert(sizeof(RingCursor) == kCacheLine);
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "cursors are shared between processes: they must be lock-free");

/// The shared part of a ring: head (written by the consumer) and tail (written by the producer).
/// Cursors are monotonic 64-bit counters; slot = cursor & (depth - 1).
struct RingControl {
    RingCursor head;
    RingCursor tail;
};
static_assert(sizeof(RingControl) == 2 * kCacheLine);
static_assert(std::is_trivially_destructible_v<RingControl>);

/// The producing side of a ring. Private state: our tail, a cached copy of their head.
template <class T>
class RingProducer {
    static_assert(std::is_trivially_copyable_v<T>, "ring entries are copied as bytes");

public:
    RingProducer() = default;
    RingProducer(RingControl *ctl, T *slots, uint32_t depth)
        : ctl_(ctl), slots_(slots), mask_(depth - 1), depth_(depth) {
        // The segment creator zeroes both cursors; a producer attaching later continues from
        // the published tail. It assumes the ring full until it has loaded and validated the
        // consumer's head (first freeSlots()): unread entries may still sit between the two.
        tail_ = ctl_->tail.value.load(std::memory_order_relaxed);
        head_cache_ = tail_ - depth_;
    }

    /// Free slots, refreshing the consumer's head only when the cached one says fewer than
    /// `want` are free.
    uint32_t freeSlots(uint32_t want = 1) {
        if (corrupt_) {
            return 0;
        }
        if (tail_ - head_cache_ + want > depth_) {
            refreshHead();
        }
        return corrupt_ ? 0 : static_cast<uint32_t>(depth_ - (tail_ - head_cache_));
    }

    /// Writes one entry without publishing it. False when full or corrupt.
    bool push(const T &v) {
        if (freeSlots() == 0) {
            return false;
        }
        std::memcpy(static_cast<void *>(&slots_[tail_ & mask_]), &v, sizeof(T));
        ++tail_;
        return true;
    }

    /// Makes every pushed entry visible to the consumer.
    void publish() {
        // SYNC POINT: release orders the slot writes above before the new tail; pairs with the
        // consumer's acquire load of tail in RingConsumer::available().
        ctl_->tail.value.store(tail_, std::memory_order_release);
    }

    /// Entries pushed (published or not) that the consumer has not released yet, as last seen.
    uint64_t inFlight() {
        refreshHead();
        return tail_ - head_cache_;
    }
    /// Re-reads and validates the consumer's head; false once it is corrupt.
    bool check() {
        if (!corrupt_) {
            refreshHead();
        }
        return !corrupt_;
    }
    bool corrupt() const { return corrupt_; }
    uint32_t depth() const { return static_cast<uint32_t>(depth_); }
    uint64_t tail() const { return tail_; }

private:
    void refreshHead() {
        // SYNC POINT: acquire pairs with the consumer's release store of head, so slots it has
        // released are no longer read by it when we overwrite them.
        uint64_t head = ctl_->head.value.load(std::memory_order_acquire);
        if (head > tail_ || tail_ - head > depth_) {
            corrupt_ = true;  // the other side wrote a head it cannot have reached
            return;
        }
        head_cache_ = head;
    }

    RingControl *ctl_ = nullptr;
    T *slots_ = nullptr;
    uint64_t mask_ = 0;
    uint64_t depth_ = 0;
    uint64_t tail_ = 0;
    uint64_t head_cache_ = 0;
    bool corrupt_ = false;
};

/// The consuming side of a ring. Private state: our head, a cached copy of their tail.
template <class T>
class RingConsumer {
    static_assert(std::is_trivially_copyable_v<T>, "ring entries are copied as bytes");

public:
    RingConsumer() = default;
    RingConsumer(RingControl *ctl, T *slots, uint32_t depth)
        : ctl_(ctl), slots_(slots), mask_(depth - 1), depth_(depth) {
        head_ = ctl_->head.value.load(std::memory_order_relaxed);
        tail_cache_ = head_;
    }

    /// Entries ready to read; reloads the producer's tail only when the cached one is used up.
    uint32_t available() {
        if (corrupt_) {
            return 0;
        }
        if (tail_cache_ == head_) {
            // SYNC POINT: acquire pairs with the producer's release store in publish(): the
            // slots up to tail are fully written before we copy them out.
            uint64_t tail = ctl_->tail.value.load(std::memory_order_acquire);
            if (tail < head_ || tail - head_ > depth_) {
                corrupt_ = true;  // a tail the producer cannot have written honestly
                return 0;
            }
            tail_cache_ = tail;
        }
        return static_cast<uint32_t>(tail_cache_ - head_);
    }

    /// Copies entry `i` (0 = oldest unread) out of shared memory. The copy is what callers
    /// validate: the producer may change the slot after this returns.
    T read(uint32_t i) const {
        T out;
        std::memcpy(&out, static_cast<const void *>(&slots_[(head_ + i) & mask_]), sizeof(T));
        return out;
    }

    /// Copies the oldest entry out and releases it in one go. False when empty.
    bool pop(T &out) {
        if (available() == 0) {
            return false;
        }
        out = read(0);
        release(1);
        return true;
    }

    /// Gives `n` read entries back to the producer.
    void release(uint32_t n) {
        head_ += n;
        // SYNC POINT: release orders our reads of the slots before the producer may reuse them;
        // pairs with the acquire load in RingProducer::refreshHead().
        ctl_->head.value.store(head_, std::memory_order_release);
    }

    bool corrupt() const { return corrupt_; }
    uint32_t depth() const { return static_cast<uint32_t>(depth_); }
    uint64_t head() const { return head_; }

private:
    RingControl *ctl_ = nullptr;
    const T *slots_ = nullptr;
    uint64_t mask_ = 0;
    uint64_t depth_ = 0;
    uint64_t head_ = 0;
    uint64_t tail_cache_ = 0;
    bool corrupt_ = false;
};

}  // namespace tensorlane::ipc
