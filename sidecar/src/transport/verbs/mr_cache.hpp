// Memory registrations of one protection domain, keyed by allocation: every region inside a
// registered allocation (a range of a tl_alloc_host buffer, a tensor inside a cudaMalloc block)
// uses its allocation's MR, so registering a second region costs nothing (DESIGN.md, "a
// registration cache keyed by allocation"). Registrations run on the Registrar's thread; until
// one is done the region is "pending" and the write waits in its peer's queue.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "tensorlane/sidecar/region.hpp"
#include "transport/verbs/objects.hpp"
#include "transport/verbs/registrar.hpp"

namespace tensorlane::sidecar {

/// Where a region sits in its allocation's MR.
struct MrView {
    ibv_mr *mr = nullptr;
    uint64_t addr = 0;  ///< the region's first byte, as the MR addresses it (its iova)
};

class MrCache {
public:
    MrCache(std::shared_ptr<ibv_pd> pd, Registrar &registrar, RegionTable &regions);
    ~MrCache();
    MrCache(const MrCache &) = delete;
    MrCache &operator=(const MrCache &) = delete;

    /// The MR for `r` with `access`; an empty view while it is being registered (a job is
    /// started the first time), or with `*error` when registration failed.
    MrView get(const Region &r, unsigned access, std::string *error);
    /// Takes a Registrar result meant for this cache; false when it is not ours.
    bool complete(Registrar::Result &result);
    /// Drops every MR of the allocation `root` (its last user ended).
    void dropAllocation(uint64_t root);
    ibv_pd *pd() const { return pd_.get(); }
    size_t size() const { return entries_.size(); }
    /// MRs registered through dma-buf (the rest: host memory or nvidia-peermem).
    size_t dmabufCount() const;

    /// The allocation a region lies in: host buffers by their id, CUDA memory by its dma-buf.
    static uint64_t rootOf(const Region &r);

private:
    struct Entry {
        uint64_t job = 0;
        verbs_detail::MrPtr mr;
        uint64_t base = 0;  ///< iova of the allocation's first byte
        bool dmabuf = false;
        int error = 0;
        std::shared_ptr<void> keepalive;
    };
    using Key = std::pair<uint64_t, unsigned>;

    std::shared_ptr<ibv_pd> pd_;
    Registrar &registrar_;
    RegionTable &regions_;
    std::map<Key, Entry> entries_;
    std::map<uint64_t, Key> by_job_;
};

}  // namespace tensorlane::sidecar
