// Lock-free single-producer single-consumer ring over a slot array in shared memory.
//
// Each slot ends in a 64-bit sequence word that the ring owns (`ring_seq`, the entry type's last
// eight bytes). Publishing entry number p (0, 1, 2, ...) writes its payload, then stores p + 1 in
// its ring_seq with release; the consumer at head h polls slot h's ring_seq until it reads h + 1.
// A round trip through two rings thus costs one cache-line transfer per direction (the slot),
// not two (the tail cursor, then the slot), which is what makes the no-op round trip several
// times cheaper than a socket. The same idea as FastForward (Giacomoni et al., PPoPP 2008) and
// the Linux kernel's ptr_ring, where the slot's own content says whether it is full; here a
// sequence number, so that a stale slot from the previous lap can never look new.
//
// The ring lives in memory that the other side can scribble on:
// - the consumer never reads the producer's tail cursor (the producer still stores it, for
//   observers such as `tensorlane status` and tests), only slot sequence words, and it takes a
//   slot only when the word is exactly the next position: a forged word yields a forged entry,
//   which the caller validates like any other, and never a read outside the slot array;
// - the producer keeps its tail privately and loads, validates (0 <= tail - head <= depth) and
//   caches the consumer's head. A bad head marks the ring corrupt and every later call fails:
//   no slot the consumer has not released is overwritten.
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
static_assert(std::atomic_ref<uint64_t>::is_always_lock_free,
              "slot sequence words are shared between processes: they must be lock-free");

/// The shared part of a ring: head (written by the consumer) and tail (written by the producer).
/// Cursors are monotonic 64-bit counters; slot = cursor & (depth - 1).
struct RingControl {
    RingCursor head;
    RingCursor tail;
};
static_assert(sizeof(RingControl) == 2 * kCacheLine);
static_assert(std::is_trivially_destructible_v<RingControl>);

/// What a ring entry must be: trivially copyable, and ending in the ring's own `uint64_t
/// ring_seq` (0 in a fresh segment; p + 1 once entry p is published in that slot).
template <class T>
constexpr bool isRingEntry() {
    if constexpr (std::is_standard_layout_v<T> &&
                  requires { requires std::is_same_v<decltype(T::ring_seq), uint64_t>; }) {
        return std::is_trivially_copyable_v<T> &&
               offsetof(T, ring_seq) == sizeof(T) - sizeof(uint64_t) &&
               alignof(T) >= alignof(uint64_t);
    } else {
        return false;  // no uint64_t ring_seq member (or offsetof would not be defined)
    }
}

namespace detail {
/// The sequence word of a slot, for atomic access. The slot array is shared memory that both
/// processes map; the word is only ever accessed through std::atomic_ref.
template <class T>
std::atomic_ref<uint64_t> seqOf(const T *slot) {
    return std::atomic_ref<uint64_t>(const_cast<T *>(slot)->ring_seq);
}
}  // namespace detail

/// The producing side of a ring. Private state: our tail, what we published, a cached copy of
/// the consumer's head.
template <class T>
class RingProducer {
    static_assert(isRingEntry<T>(), "ring entries are trivially copyable and end in ring_seq");
    static constexpr size_t kPayload = sizeof(T) - sizeof(uint64_t);

public:
    RingProducer() = default;
    RingProducer(RingControl *ctl, T *slots, uint32_t depth)
        : ctl_(ctl), slots_(slots), mask_(depth - 1), depth_(depth) {
        // The segment creator zeroes both cursors; a producer attaching later continues from
        // the published tail. It assumes the ring full until it has loaded and validated the
        // consumer's head (first freeSlots()): unread entries may still sit between the two.
        tail_ = ctl_->tail.value.load(std::memory_order_relaxed);
        published_ = tail_;
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

    /// Writes one entry's payload without publishing it (its ring_seq is the ring's and is
    /// ignored). False when full or corrupt.
    bool push(const T &v) {
        if (freeSlots() == 0) {
            return false;
        }
        // The sequence word is left alone: the consumer may be polling it right now (it still
        // holds the previous lap's number, which is not the one it waits for).
        std::memcpy(static_cast<void *>(&slots_[tail_ & mask_]), &v, kPayload);
        ++tail_;
        return true;
    }

    /// Makes every pushed entry visible to the consumer, oldest first.
    void publish() {
        for (; published_ != tail_; ++published_) {
            // SYNC POINT: release orders this slot's payload (written in push()) before its
            // sequence word; pairs with the consumer's acquire load in RingConsumer::ready().
            detail::seqOf(&slots_[published_ & mask_])
                .store(published_ + 1, std::memory_order_release);
        }
        // For observers only (status, tests): consumers poll the slots, never this cursor, so
        // this store stays in our cache. Release keeps it behind the slots it counts.
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
    uint64_t published_ = 0;
    uint64_t head_cache_ = 0;
    bool corrupt_ = false;
};

/// The consuming side of a ring. Private state: our head, and how many entries after it are
/// known to be published. It never fails: whatever the producer writes, it reads only slots of
/// the array, and only those whose sequence word is the expected one.
template <class T>
class RingConsumer {
    static_assert(isRingEntry<T>(), "ring entries are trivially copyable and end in ring_seq");
    static constexpr size_t kPayload = sizeof(T) - sizeof(uint64_t);

public:
    RingConsumer() = default;
    RingConsumer(RingControl *ctl, const T *slots, uint32_t depth)
        : ctl_(ctl), slots_(slots), mask_(depth - 1), depth_(depth) {
        head_ = ctl_->head.value.load(std::memory_order_relaxed);
        ready_to_ = head_;
    }

    /// Entries ready to read. Looks at the slots only when the known ones are used up, then
    /// counts every consecutive published slot (at most depth).
    uint32_t available() {
        if (ready_to_ == head_) {
            while (ready_to_ - head_ < depth_ && ready(ready_to_)) {
                ++ready_to_;
            }
        }
        return static_cast<uint32_t>(ready_to_ - head_);
    }

    /// Whether entry `pos` (a position, not an index) is published. Touches only that slot's
    /// sequence word; safe to call from a thread that does not own this consumer.
    bool ready(uint64_t pos) const { return sequenceAt(pos) == pos + 1; }
    /// The raw sequence word of the slot that holds position `pos`; see ready().
    uint64_t sequenceAt(uint64_t pos) const {
        // SYNC POINT: acquire pairs with the producer's release store in publish(): the slot's
        // payload is fully written before we copy it out.
        return detail::seqOf(&slots_[pos & mask_]).load(std::memory_order_acquire);
    }

    /// Copies entry `i` (0 = oldest unread, i < available()) out of shared memory. The copy is
    /// what callers validate: a hostile producer may change the slot after this returns.
    T read(uint32_t i) const {
        T out;
        std::memcpy(static_cast<void *>(&out),
                    static_cast<const void *>(&slots_[(head_ + i) & mask_]), kPayload);
        out.ring_seq = head_ + i + 1;
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
        if (ready_to_ < head_) {
            ready_to_ = head_;  // a caller that released more than it read: look again
        }
        // SYNC POINT: release orders our reads of the slots before the producer may reuse them;
        // pairs with the acquire load in RingProducer::refreshHead().
        ctl_->head.value.store(head_, std::memory_order_release);
    }

    uint32_t depth() const { return static_cast<uint32_t>(depth_); }
    uint64_t head() const { return head_; }

private:
    RingControl *ctl_ = nullptr;
    const T *slots_ = nullptr;
    uint64_t mask_ = 0;
    uint64_t depth_ = 0;
    uint64_t head_ = 0;
    uint64_t ready_to_ = 0;
};

}  // namespace tensorlane::ipc
