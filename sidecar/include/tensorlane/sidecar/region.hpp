// Registered memory regions and the table the engine and the transports share.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensorlane/ipc/fd.hpp"
#include "tensorlane/ipc/shm.hpp"
#include "tensorlane/sidecar/status.hpp"

namespace tensorlane::sidecar {

class CudaImport;  // sidecar/src/cuda/import.hpp

using RegionId = uint64_t;
using SessionId = uint64_t;

/// What kind of memory a region is (its memory domain).
enum class MemoryKind : uint8_t {
    kHost,  ///< a tl_alloc_host buffer (or a range of one), mapped in the sidecar too
    kCuda,  ///< CUDA device memory of a client, reached through its IPC handle or dma-buf fd
};
const char *toString(MemoryKind k);

/// The CUDA side of a device-memory region: what the owner exported for its allocation.
///
/// For a transport that needs the memory (docs/gpu.md, "What a transport gets"):
/// - `dmabuf` (may be empty): the owner's dma-buf fd of the WHOLE allocation, so
///   ibv_reg_dmabuf_mr(pd, offset = 0, length = alloc_bytes, iova, fd, access) registers all of
///   it once; the region is [alloc_offset, alloc_offset + bytes) of that.
/// - `import->base(&dptr)`: the sidecar's own device address of the allocation's first byte
///   (a cached CUDA IPC import, made on first use; transport threads only: it may take ms), so
///   the region starts at dptr + alloc_offset (peermem fallback: ibv_reg_mr on that address).
/// - `import->ordinal()`: the device as the sidecar numbers it (-1: not visible here).
struct CudaMemory {
    int device = -1;                             ///< the owner's CUDA ordinal (diagnostics)
    std::array<unsigned char, 64> ipc_handle{};  ///< cudaIpcMemHandle_t of the allocation
    /// The dma-buf fd of the whole allocation (ibv_reg_dmabuf_mr), shared by its regions.
    std::shared_ptr<ipc::UniqueFd> dmabuf;
    uint64_t alloc_bytes = 0;     ///< size of the whole allocation
    uint64_t alloc_offset = 0;    ///< where the region starts in it
    uint64_t client_address = 0;  ///< the owner's device address of the region (diagnostics)
    /// The allocation's import, shared by every region in it; holds `dmabuf` too. Released
    /// (mapping closed, fd closed) when the last region and the last transfer let go.
    std::shared_ptr<CudaImport> import;
};

/// Why a transport that copies through the sidecar's own mappings (local, tcp) refuses a
/// write from or to a Region::dmabufOnly() region.
inline constexpr const char *kDmabufOnlyReason =
    "a region registered from a dma-buf alone (tl_register_dmabuf, or VMM memory made without a "
    "shareable handle type) is reachable only by the verbs transport";

/// "[1000, 1001]": uids or gids in an access list or a reservation, for refusals' texts.
std::string idList(const std::vector<uint32_t> &ids);

/// Who may write an exposed region (tl_expose_access; DESIGN.md, "Locally, an exposed region
/// is writable by its owner's uid and root; other local uids only when the owner grants them").
/// Set at expose, read on the engine thread only (lookup and every local write's validation).
struct RegionAccess {
    uint32_t owner_uid = 0;      ///< the exposing client's uid (SO_PEERCRED)
    bool peers = true;           ///< offered to the configured peers (kAccessPeers)
    bool any_local = false;      ///< every admitted local client (kAccessLocalAny)
    std::vector<uint32_t> uids;  ///< local uids allowed besides the owner's and root
    std::vector<uint32_t> gids;  ///< local clients with one of these groups

    /// Whether a local client with `uid` and `groups` (primary and supplementary) may write.
    bool allows(uint32_t uid, const std::vector<uint32_t> &groups) const;
    /// The list in words, for the refusal's text: "owner uid 1000, uids [1001], gids []".
    std::string describe() const;
};

/// Memory the sidecar can read and write on behalf of a client: a host buffer from AllocHost
/// (the sidecar maps it too), a range of one, or CUDA device memory. Kept alive by shared_ptr
/// while any transfer uses it, so a deregister during a transfer never unmaps memory under a
/// transport; transports deregister it only once `users` is back to zero.
struct Region {
    RegionId id = 0;
    SessionId owner = 0;
    RegionId parent = 0;  ///< the AllocHost buffer this range lies in (0: it is one)
    MemoryKind kind = MemoryKind::kHost;
    /// The sidecar's address of the region's first byte: host memory mapped here, or CUDA
    /// memory once imported (nullptr until then).
    unsigned char *base = nullptr;
    uint64_t bytes = 0;
    std::shared_ptr<ipc::Mapping> mapping;  ///< keeps host memory mapped
    CudaMemory cuda;                        ///< kCuda only
    /// Writes posted and not yet ended that read or write this region (engine thread).
    uint32_t users = 0;
    std::string exposed_name;          ///< empty: not exposed (engine thread and table lock only)
    std::atomic<bool> exposed{false};  ///< what transport threads check instead of the name
    std::atomic<bool> revoked{false};  ///< deregistered: no transfer may start on it
    RegionAccess access;               ///< who may write it once exposed (engine thread)

    /// CUDA (or other device) memory known only by its dma-buf: the sidecar has no mapping of
    /// it, so only a transport that registers dma-bufs with the NIC reaches it.
    bool dmabufOnly() const { return kind == MemoryKind::kCuda && cuda.import == nullptr; }

    /// True when [offset, offset + len) lies inside the region, overflow-safe, len > 0.
    bool contains(uint64_t offset, uint64_t len) const {
        return len > 0 && offset <= bytes && len <= bytes - offset;
    }
};

/// The sidecar's regions. Only the engine thread uses it (transports that run threads of their
/// own get the regions they need resolved in the WriteOp), so it takes no lock: find() on the
/// request path is one hash lookup.
class RegionTable {
public:
    /// A fresh id (never reused), for a region about to be added: the transports see it in
    /// registerRegion before the region is in the table.
    RegionId takeId() { return next_id_++; }
    /// Adds a region; one without an id (0) gets a fresh one.
    RegionId add(std::shared_ptr<Region> r);
    /// Removes it, marks it revoked and returns it (nullptr if unknown).
    std::shared_ptr<Region> remove(RegionId id);
    /// The region, or nullptr.
    std::shared_ptr<Region> find(RegionId id) const;
    /// The exposed region named `name`, or nullptr.
    std::shared_ptr<Region> findExposed(const std::string &name) const;
    /// Exposes `id` under `name` with `access`. kInvalid if the name is taken by another
    /// region; kInvalid if the region is offered to peers already and `access` would withdraw
    /// it (peers hold its descriptor: deregister it instead).
    Status expose(RegionId id, const std::string &name, RegionAccess access = {});
    /// Every exposed region offered to peers (bootstrap descriptors, verbs MRs); a region
    /// exposed without kAccessPeers is never in it.
    std::vector<std::shared_ptr<Region>> exposed() const;
    /// Every region of one session, in id order.
    std::vector<std::shared_ptr<Region>> ofSession(SessionId s) const;
    /// How many regions one session holds.
    size_t countOfSession(SessionId s) const;
    uint64_t registeredBytes() const;
    size_t size() const;

private:
    RegionId next_id_ = 1;
    std::unordered_map<RegionId, std::shared_ptr<Region>> by_id_;
    std::map<std::string, RegionId> by_name_;
    std::unordered_map<SessionId, std::map<RegionId, Region *>> by_session_;
    uint64_t host_bytes_ = 0;  ///< of buffers (parent == 0)
};

}  // namespace tensorlane::sidecar
