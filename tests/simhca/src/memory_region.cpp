#include "memory_region.hpp"

#include <sys/mman.h>

#include <cstring>

#include "cuda_driver.hpp"
#include "umem.hpp"

#if defined(__SANITIZE_THREAD__)
#define SIMHCA_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SIMHCA_TSAN 1
#endif
#endif

#ifdef SIMHCA_TSAN
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
#endif

namespace tensorlane::simhca {
namespace {

// The simulated HCA's DMA into and out of registered memory. A device's writes are not C++
// accesses: applications legitimately poll memory the HCA writes (ib_write_lat spins on the
// last byte of its buffer) and order their own reads by the CQ, not by a lock the "device"
// holds. Under ThreadSanitizer these copies are therefore not tracked; every other access of
// the simulator (queues, CQs, QP state, counters) is.
void dmaCopy(void *dst, const void *src, size_t n) {
#ifdef SIMHCA_TSAN
    __tsan_ignore_thread_begin();
#endif
    std::memcpy(dst, src, n);
#ifdef SIMHCA_TSAN
    __tsan_ignore_thread_end();
#endif
}

}  // namespace

MemoryRegion::MemoryRegion(ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access,
                           MemoryKind kind, void *cuda_ctx, uint32_t key)
    : pd_(pd),
      addr_(addr),
      length_(length),
      iova_(iova),
      access_(access),
      kind_(kind),
      cuda_ctx_(cuda_ctx),
      key_(key) {
    handle_.self = this;
    ibv_mr &m = handle_.ibv;
    m.context = pd->context;
    m.pd = pd;
    m.addr = addr;
    m.length = length;
    m.handle = key >> 8;
    m.lkey = key;
    m.rkey = key;
}

MemoryRegion::~MemoryRegion() {
    if (map_base_ != nullptr) {
        ::munmap(map_base_, map_len_);
    }
    if (pinned_pages_ != 0) {
        PinnedVm::instance().uncharge(pinned_owner_, pinned_pages_);
    }
}

bool MemoryRegion::contains(uint64_t iova, uint64_t len) const {
    if (iova < iova_) {
        return false;
    }
    const uint64_t off = iova - iova_;
    return off <= length_ && len <= length_ - off;
}

bool MemoryRegion::write(uint64_t iova, const void *src, size_t n) const {
    if (n == 0) {
        return true;
    }
    if (kind_ == MemoryKind::kCuda) {
        return CudaDriver::instance().copyToDevice(
            cuda_ctx_, reinterpret_cast<uint64_t>(addr_) + (iova - iova_), src, n);
    }
    dmaCopy(hostAddress(iova), src, n);
    return true;
}

bool MemoryRegion::read(uint64_t iova, void *dst, size_t n) const {
    if (n == 0) {
        return true;
    }
    if (kind_ == MemoryKind::kCuda) {
        return CudaDriver::instance().copyFromDevice(
            cuda_ctx_, dst, reinterpret_cast<uint64_t>(addr_) + (iova - iova_), n);
    }
    dmaCopy(dst, hostAddress(iova), n);
    return true;
}

}  // namespace tensorlane::simhca
