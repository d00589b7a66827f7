// The client's regions and remotes as the sidecar gave them out: enough to refuse a request
// that is wrong on its face before it reaches the ring (the sidecar checks everything again),
// and the tl_alloc_host buffers this process has mapped. Thread-safe (a reader-writer lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <shared_mutex>
#include <string>
#include <unordered_map>

#include "tensorlane/ipc/shm.hpp"
#include "tensorlane/tensorlane.h"

namespace tensorlane::shim {

class RegionTable {
public:
    RegionTable() = default;
    /// Unpins the buffers still mapped (before their mappings go).
    ~RegionTable();
    RegionTable(const RegionTable &) = delete;
    RegionTable &operator=(const RegionTable &) = delete;

    /// A tl_alloc_host buffer, its region and its mapping (`pinned`: registered with CUDA).
    void addHostBuffer(tl_region r, size_t bytes, std::unique_ptr<ipc::Mapping> mapping,
                       bool pinned);
    /// The tl_alloc_host buffer that holds all of [addr, addr + bytes): its region and the
    /// offset into it. False when none does.
    bool findHostBuffer(uintptr_t addr, size_t bytes, tl_region *parent, uint64_t *offset) const;
    /// A range of tl_alloc_host buffer `parent`.
    void addRange(tl_region r, void *ptr, size_t bytes, tl_region parent);
    /// CUDA device memory in the allocation with CUDA buffer id `cuda_key`.
    void addCuda(tl_region r, void *ptr, size_t bytes, uint64_t cuda_key);
    bool contains(tl_region r) const;
    /// Forgets `r`; a tl_alloc_host buffer takes its ranges along and is unmapped (unpinned
    /// first, with the table unlocked: the unpin waits for the process's GPU work). For CUDA
    /// memory `drop_cuda(cuda_key)` runs while the table is still locked.
    void erase(tl_region r, const std::function<void(uint64_t)> &drop_cuda);

    /// A remote from tl_lookup and its size.
    void addRemote(tl_remote r, uint64_t bytes);
    /// The size of a remote from tl_lookup; false when it is none.
    bool remoteBytes(tl_remote r, uint64_t *bytes) const;

    /// Checks n writes against the table (one lock): false with the first bad entry's index
    /// and what is wrong with it.
    bool checkWrites(const tl_write_desc *w, size_t n, size_t *bad, std::string *why) const;

private:
    struct LocalRegion {
        unsigned char *base = nullptr;
        uint64_t bytes = 0;
        tl_region parent = 0;  ///< 0: a tl_alloc_host buffer itself (or CUDA memory)
        bool cuda = false;
        uint64_t cuda_key = 0;  ///< its allocation's CUDA buffer id
    };
    struct HostBuffer {
        tl_region region = 0;
        std::unique_ptr<ipc::Mapping> mapping;
        bool pinned = false;  ///< registered with CUDA (cuMemHostRegister)
    };

    /// One write checked (mu_ held).
    bool validWrite(const tl_write_desc &w, std::string *why) const;

    mutable std::shared_mutex mu_;
    std::unordered_map<tl_region, LocalRegion> regions_;
    std::map<uintptr_t, HostBuffer> buffers_;          ///< by base address
    std::unordered_map<tl_remote, uint64_t> remotes_;  ///< handle → bytes
};

}  // namespace tensorlane::shim
