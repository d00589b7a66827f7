// Memory registrations of one protection domain. Two scopes (docs/verbs.md, "Memory"):
//
// - kRegion (a receiving session: the keys a peer gets): one MR per exposed region, on exactly
//   its bytes ([base, base + bytes) of host memory; [alloc_offset, alloc_offset + bytes) of a
//   CUDA allocation's dma-buf, or of the sidecar's IPC mapping of it). Its rkey reaches nothing
//   else: a write a byte outside the region is refused by the HCA.
// - kAllocation (a sending session: local keys of the sources of our writes, which never leave
//   the node): one MR per allocation, shared by every region in it, so registering a second
//   region costs nothing (DESIGN.md, "a registration cache keyed by allocation").
//
// Either way an entry is keyed by the sidecar's own identity of the memory, never by a number a
// client chose: a region by its id (the sidecar gives them, never reused), an allocation by the
// object the sidecar holds for it (the shared-memory mapping of a tl_alloc_host buffer, the
// CudaImport of a CUDA allocation). The entry holds that object, so its address cannot name
// another allocation while the entry lives. Registrations run on the Registrar's thread; until
// one is done the region is "pending" and the write waits in its peer's queue.
#pragma once

#include <infiniband/verbs.h>

#include <compare>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensorlane/sidecar/region.hpp"
#include "transport/verbs/objects.hpp"
#include "transport/verbs/registrar.hpp"

namespace tensorlane::sidecar {

/// Where a region sits in its MR.
struct MrView {
    ibv_mr *mr = nullptr;
    uint64_t addr = 0;  ///< the region's first byte, as the MR addresses it (its iova)
};

class MrCache {
public:
    enum class Scope {
        kRegion,      ///< one MR on exactly each region (remote keys)
        kAllocation,  ///< one MR per allocation (local keys)
    };

    MrCache(std::shared_ptr<ibv_pd> pd, Registrar &registrar, Scope scope);
    ~MrCache();
    MrCache(const MrCache &) = delete;
    MrCache &operator=(const MrCache &) = delete;

    /// The MR for `r` with `access`; an empty view while it is being registered (a job is
    /// started the first time), or with `*error` when registration failed. `r` becomes a user
    /// of the MR until release(r.id).
    MrView get(const Region &r, unsigned access, std::string *error);
    /// Takes a Registrar result meant for this cache; false when it is not ours.
    bool complete(Registrar::Result &result);
    /// Region `id` uses this cache no more: every MR no other region uses is deregistered now
    /// (a registration still running is deregistered when it completes).
    void release(RegionId id);
    ibv_pd *pd() const { return pd_.get(); }
    size_t size() const { return entries_.size(); }
    /// MRs registered through dma-buf (the rest: host memory or nvidia-peermem).
    size_t dmabufCount() const;

    /// What one MR of this cache is for. kind: 0 a region (id), 1 host memory (the segment's
    /// mapping), 2 a CUDA allocation (its import), 3 a CUDA allocation known by its dma-buf
    /// only (the fd object the sidecar holds).
    struct Key {
        uint8_t kind = 0;
        uint64_t identity = 0;
        unsigned access = 0;
        auto operator<=>(const Key &) const = default;
    };
    /// The key `r` has in a cache of `scope` (tests, the fuzz target).
    static Key keyOf(const Region &r, unsigned access, Scope scope);
    /// The iova of the first byte of a CUDA region's own MR: the owner's address of it, its
    /// page offset made that of the region in its allocation, as the kernel requires of both
    /// ibv_reg_dmabuf_mr (offset, iova) and ibv_reg_mr (address, iova).
    static uint64_t cudaRegionIova(const Region &r);

private:
    struct Entry {
        uint64_t job = 0;
        verbs_detail::MrPtr mr;
        uint64_t base = 0;  ///< iova of the MR's first byte
        bool dmabuf = false;
        int error = 0;
        std::shared_ptr<void> keepalive;
        std::set<RegionId> users;
    };
    /// Fills `job` (and the entry's base and keepalive) for `r`; false with `*error` when `r`
    /// cannot be registered.
    bool prepare(const Region &r, const Key &key, Registrar::Job *job, Entry *e,
                 std::string *error) const;

    std::shared_ptr<ibv_pd> pd_;
    Registrar &registrar_;
    const Scope scope_;
    std::map<Key, Entry> entries_;
    std::map<uint64_t, Key> by_job_;
    std::unordered_map<RegionId, std::vector<Key>> keys_of_;
};

}  // namespace tensorlane::sidecar
