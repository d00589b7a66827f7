// Helpers shared by the ipc unit and stress tests: a ring whose slots sit between PROT_NONE guard
// pages (so a read or write outside the slots faults at once) and can be locked entirely (so a
// call that must not touch the slots faults if it does), plus sanitizer detection.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "tensorlane/ipc/spsc_ring.hpp"

#if defined(__SANITIZE_THREAD__)
#define TL_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TL_TEST_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define TL_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TL_TEST_ASAN 1
#endif
#endif

namespace tensorlane::ipc::test {

/// A 64-byte ring entry that carries its own sequence number and a checksum of its payload,
/// then the ring's sequence word.
struct Entry {
    uint64_t seq;
    uint64_t payload[5];
    uint64_t check;
    uint64_t ring_seq;
};
static_assert(sizeof(Entry) == 64);

/// splitmix64: a cheap, well-mixed function of the sequence number.
constexpr uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

inline Entry makeEntry(uint64_t seq) {
    Entry e{};
    e.seq = seq;
    uint64_t sum = seq;
    for (int i = 0; i < 5; ++i) {
        e.payload[i] = mix(seq * 8 + static_cast<uint64_t>(i));
        sum = sum * 31 + e.payload[i];
    }
    e.check = sum;
    return e;
}

inline bool entryIsIntact(const Entry &e) {
    uint64_t sum = e.seq;
    for (int i = 0; i < 5; ++i) {
        if (e.payload[i] != mix(e.seq * 8 + static_cast<uint64_t>(i))) {
            return false;
        }
        sum = sum * 31 + e.payload[i];
    }
    return sum == e.check;
}

/// A ring in its own mapping: [control page][guard][slot pages][guard], guards PROT_NONE. The
/// slots end exactly at the trailing guard page, so an overrun faults on the first byte past the
/// last slot; lockSlots() makes the slots themselves fault.
template <class T>
class GuardedRing {
public:
    explicit GuardedRing(uint32_t depth) : depth_(depth) {
        page_ = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
        slot_bytes_ = (size_t{depth} * sizeof(T) + page_ - 1) / page_ * page_;
        total_ = page_ + page_ + slot_bytes_ + page_;
        void *p =
            ::mmap(nullptr, total_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            throw std::runtime_error("mmap failed");
        }
        base_ = static_cast<unsigned char *>(p);
        if (::mprotect(base_ + page_, page_, PROT_NONE) != 0 ||
            ::mprotect(base_ + 2 * page_ + slot_bytes_, page_, PROT_NONE) != 0) {
            throw std::runtime_error("mprotect failed");
        }
        ctl_ = reinterpret_cast<RingControl *>(base_);
        // Slots end at the trailing guard page: an overrun faults on the first byte past them.
        slots_ = reinterpret_cast<T *>(base_ + 2 * page_ + slot_bytes_ - size_t{depth} * sizeof(T));
    }
    GuardedRing(const GuardedRing &) = delete;
    GuardedRing &operator=(const GuardedRing &) = delete;
    ~GuardedRing() { ::munmap(base_, total_); }

    RingControl *ctl() const { return ctl_; }
    T *slots() const { return slots_; }
    uint32_t depth() const { return depth_; }
    RingProducer<T> producer() const { return RingProducer<T>(ctl_, slots_, depth_); }
    RingConsumer<T> consumer() const { return RingConsumer<T>(ctl_, slots_, depth_); }

    /// Makes every slot inaccessible: any read or write of a slot from now on is a SIGSEGV.
    void lockSlots() { ::mprotect(base_ + 2 * page_, slot_bytes_, PROT_NONE); }
    void unlockSlots() { ::mprotect(base_ + 2 * page_, slot_bytes_, PROT_READ | PROT_WRITE); }

    /// Stores hostile cursor values the way a misbehaving peer process would.
    void setHead(uint64_t v) { ctl_->head.value.store(v, std::memory_order_release); }
    void setTail(uint64_t v) { ctl_->tail.value.store(v, std::memory_order_release); }
    uint64_t sharedHead() const { return ctl_->head.value.load(std::memory_order_acquire); }
    uint64_t sharedTail() const { return ctl_->tail.value.load(std::memory_order_acquire); }
    /// Stores a slot's sequence word the way a misbehaving producer would (release, so a
    /// consumer that takes the slot also sees the payload written before).
    void setSlotSeq(uint64_t pos, uint64_t word) {
        std::atomic_ref<uint64_t>(slots_[pos & (depth_ - 1)].ring_seq)
            .store(word, std::memory_order_release);
    }

private:
    uint32_t depth_;
    size_t page_ = 0;
    size_t slot_bytes_ = 0;
    size_t total_ = 0;
    unsigned char *base_ = nullptr;
    RingControl *ctl_ = nullptr;
    T *slots_ = nullptr;
};

/// GCC's ThreadSanitizer does not instrument copies wider than 16 bytes, such as the ring's memcpy
/// of a 64-byte entry, so an ordering bug in the ring would go unseen. The stress tests therefore
/// also touch each slot with a plain 8-byte access where the ring copies it (the producer right
/// after push, the consumer before release); TSan checks the ring's release/acquire pairs against
/// those accesses. (Checked: making the consumer's tail load relaxed is then reported.)
inline void touchPushed(Entry *slots, uint32_t depth, uint64_t tail_after_push, uint64_t seq) {
    slots[(tail_after_push - 1) & (depth - 1)].seq = seq;
}
inline uint64_t peekSeq(const Entry *slots, uint32_t depth, uint64_t cursor) {
    return slots[cursor & (depth - 1)].seq;
}

/// How many entries the stress tests move: TENSORLANE_STRESS_ITERS if set, otherwise a default
/// sized so that each test stays well under 10 s on two cores, sanitizers included.
inline uint64_t stressIterations(uint64_t plain_default) {
    if (const char *env = std::getenv("TENSORLANE_STRESS_ITERS")) {
        char *end = nullptr;
        unsigned long long v = std::strtoull(env, &end, 10);
        if (end != env && *end == '\0' && v > 0) {
            return v;
        }
    }
#if defined(TL_TEST_TSAN)
    return plain_default / 5;  // the tsan preset optimises; TSan is still ~5-15x slower
#elif defined(TL_TEST_ASAN)
    return plain_default / 4;
#elif !defined(__OPTIMIZE__)
    return plain_default / 2;  // Debug (the dev preset)
#else
    return plain_default;
#endif
}

}  // namespace tensorlane::ipc::test
