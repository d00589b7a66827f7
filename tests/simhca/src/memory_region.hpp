// A registered memory region: host memory (ibv_reg_mr, ibv_reg_mr_iova2), a mapped dma-buf
// (ibv_reg_dmabuf_mr) or CUDA device memory. The simulated HCA reaches host and mapped memory
// with memcpy and device memory through the CUDA driver (cuda_driver.hpp).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

#include "handles.hpp"

namespace tensorlane::simhca {

/// Where the bytes of a region live.
enum class MemoryKind { kHost, kCuda };

/// One MR. lkey and rkey are the same value (as on mlx5).
class MemoryRegion {
public:
    /// A region of length bytes that the HCA sees at iova and the process at addr.
    MemoryRegion(ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access, MemoryKind kind,
                 void *cuda_ctx, uint32_t key);
    ~MemoryRegion();
    MemoryRegion(const MemoryRegion &) = delete;
    MemoryRegion &operator=(const MemoryRegion &) = delete;

    /// What the application holds.
    [[nodiscard]] ibv_mr *ibv() { return &handle_.ibv; }
    /// The region behind an ibv_mr this library handed out.
    [[nodiscard]] static MemoryRegion *from(ibv_mr *mr) { return handleOf<MrHandle>(mr)->self; }
    /// The protection domain.
    [[nodiscard]] ibv_pd *pd() const { return pd_; }
    /// IBV_ACCESS_* flags.
    [[nodiscard]] int access() const { return access_; }
    /// The key.
    [[nodiscard]] uint32_t key() const { return key_; }
    /// Whether [iova, iova+len) lies inside the region (with overflow checks).
    [[nodiscard]] bool contains(uint64_t iova, uint64_t len) const;
    /// Whether the bytes are host memory (so a pointer to them can go in an iovec).
    [[nodiscard]] bool isHost() const { return kind_ == MemoryKind::kHost; }
    /// The host address of iova (host regions only).
    [[nodiscard]] uint8_t *hostAddress(uint64_t iova) const {
        return static_cast<uint8_t *>(addr_) + (iova - iova_);
    }
    /// Copies bytes into the region at iova ("DMA write"); false when the copy failed.
    [[nodiscard]] bool write(uint64_t iova, const void *src, size_t n) const;
    /// Copies bytes out of the region at iova ("DMA read").
    [[nodiscard]] bool read(uint64_t iova, void *dst, size_t n) const;
    /// Unmaps the dma-buf mapping on destruction.
    void ownMapping(void *base, size_t len) {
        map_base_ = base;
        map_len_ = len;
    }
    /// Gives `pages` back to process `owner`'s pinned count (umem.hpp) on destruction.
    void ownPinnedPages(pid_t owner, uint64_t pages) {
        pinned_owner_ = owner;
        pinned_pages_ = pages;
    }

private:
    ibv_pd *pd_;
    void *addr_;
    size_t length_;
    uint64_t iova_;
    int access_;
    MemoryKind kind_;
    void *cuda_ctx_;
    uint32_t key_;
    void *map_base_ = nullptr;
    size_t map_len_ = 0;
    pid_t pinned_owner_ = 0;
    uint64_t pinned_pages_ = 0;
    MrHandle handle_{};
};

}  // namespace tensorlane::simhca
