#include "memory_region.hpp"

#include <sys/mman.h>

#include <cstring>

#include "cuda_driver.hpp"

namespace tensorlane::simhca {

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
    std::memcpy(hostAddress(iova), src, n);
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
    std::memcpy(dst, hostAddress(iova), n);
    return true;
}

}  // namespace tensorlane::simhca
