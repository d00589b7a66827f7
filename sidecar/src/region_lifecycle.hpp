// The life of a client's region, from its registration to the moment the transports let go of
// it: the quotas a new one is checked against, making it usable by every transport, releasing
// it (and the ranges in it) when its owner deregisters it or goes, and retiring it once the last
// write that uses it has ended (DESIGN.md: "deregistered only after the work in flight on it has
// ended"). The RegionTable itself is the engine's (the transports and the peer layer read it
// too); this class is what adds to it and takes from it on a client's behalf. Engine thread only.
#pragma once

#include "spdlog_headers.hpp"  // first: fmt under its pragma

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "engine_counters.hpp"
#include "session_table.hpp"
#include "tensorlane/config/config.hpp"
#include "tensorlane/ipc/control.hpp"
#include "tensorlane/ipc/fd.hpp"
#include "tensorlane/sidecar/region.hpp"
#include "tensorlane/sidecar/status.hpp"

namespace tensorlane::sidecar {

class CudaImport;
class PeerManager;
class TransportSet;

/// The node-wide bounds on what all clients together may map and hold, resolved once at start.
struct NodeQuotas {
    /// Segments the sidecar maps at most (sessions, stream segments, host buffers):
    /// vm.max_map_count less headroom for libraries, threads and transports.
    uint64_t max_mappings = 0;
    /// Bytes of tl_alloc_host buffers of all clients ([limits] node_registered_bytes, "auto"
    /// resolved against the memory cgroup or MemTotal) and how that was chosen.
    uint64_t registered_cap = 0;
    std::string cap_source;

    /// Reads /proc and the memory cgroup.
    static NodeQuotas resolve(const config::LimitsConfig &limits);
};

class RegionLifecycle {
public:
    /// `peers` may be null (no [[peers]]). All references must outlive this object.
    RegionLifecycle(const config::LimitsConfig &limits, NodeQuotas quotas, RegionTable &table,
                    TransportSet &transports, SessionTable &sessions, PeerManager *peers,
                    EngineCounters &counters);
    RegionLifecycle(const RegionLifecycle &) = delete;
    RegionLifecycle &operator=(const RegionLifecycle &) = delete;

    // ---- quotas
    /// kNoMemory with the reason (and counted in quota_refusals) when one more region of `s`
    /// with `new_bytes` of host buffer, and a new mapping if `new_mapping`, would exceed a quota.
    Status checkQuota(const Session &s, uint64_t new_bytes, bool new_mapping);
    /// Whether the sidecar may map one more segment (vm.max_map_count).
    bool mappingRoom() const { return mappings_ < quotas_.max_mappings; }
    /// A session or stream segment was mapped, or unmapped (host buffers count themselves).
    void mapped() { ++mappings_; }
    void unmapped() { --mappings_; }
    uint64_t mappings() const { return mappings_; }
    uint64_t maxMappings() const { return quotas_.max_mappings; }
    uint64_t nodeHostBytes() const { return node_host_bytes_; }
    uint64_t nodeRegisteredCap() const { return quotas_.registered_cap; }
    const std::string &nodeCapSource() const { return quotas_.cap_source; }

    // ---- registration: each makes the region usable by every transport, then adds it.
    /// tl_alloc_host: a new sealed segment of `bytes` owned by the client's uid, after the
    /// quotas; `*fd` gets the segment's fd to send (close it after the reply).
    Status allocHost(Session &s, uint64_t bytes, RegionId *id, ipc::UniqueFd *fd);
    /// tl_register of host memory: [offset, offset + bytes) of the client's buffer `parent`.
    Status addRange(const Session &s, RegionId parent, uint64_t offset, uint64_t bytes,
                    RegionId *id);
    /// tl_register of CUDA memory whose import is verified (cuda_registrar.hpp); the quota was
    /// checked before the import was.
    Status addCuda(const Session &s, const ipc::RegisterMsg &m,
                   const std::shared_ptr<CudaImport> &imp, RegionId *id);
    /// A region of a dma-buf the sidecar does not map (tl_register_dmabuf, or VMM memory
    /// without a shareable handle): `dmabuf_bytes` is the dma-buf's real size. Only transports
    /// that register dma-bufs reach it (Region::dmabufOnly()).
    Status addCudaDmabuf(const Session &s, const ipc::RegisterMsg &m,
                         std::shared_ptr<ipc::UniqueFd> dmabuf, uint64_t dmabuf_bytes,
                         RegionId *id);
    /// Creates and exposes kProbeRegionName (engine.hpp), the sidecar's own region.
    Status exposeProbe();
    /// The probe region's id; 0 when there is none (no peers).
    RegionId probeRegion() const { return probe_region_; }

    // ---- release and retirement
    /// Removes `r` from the table (revoked: no write may start on it), with the ranges inside
    /// it; the transports let go of it once no write uses it.
    void release(const std::shared_ptr<Region> &r);
    /// Releases every region of session `id` (it is going); returns how many.
    size_t releaseSession(SessionId id);
    /// One fewer write uses `r` (a write ended): the last one of a released region retires it.
    void dropUser(const std::shared_ptr<Region> &r) {
        if (!r || --r->users != 0 || !r->revoked.load(std::memory_order_relaxed)) {
            return;
        }
        retireLast(r);
    }
    /// Released regions waiting for their last write to end.
    size_t retiring() const { return retiring_.size(); }

private:
    /// Makes `r` usable by every transport (local, tcp, verbs); an error undoes nothing.
    Status registerWithTransports(Region &r);
    /// dropUser() of a revoked region's last write.
    void retireLast(const std::shared_ptr<Region> &r);
    /// The transports let go of a region no longer in the table whose last write ended.
    void retire(const std::shared_ptr<Region> &r);

    const config::LimitsConfig &limits_;
    const NodeQuotas quotas_;
    RegionTable &table_;
    TransportSet &transports_;
    SessionTable &sessions_;
    PeerManager *const peers_;
    EngineCounters &counters_;
    std::shared_ptr<spdlog::logger> log_;
    RegionId probe_region_ = 0;
    uint64_t mappings_ = 0;         ///< segments this sidecar maps (sessions and host buffers)
    uint64_t node_host_bytes_ = 0;  ///< bytes of tl_alloc_host buffers all clients hold
    /// Regions removed from the table with writes still using them: deregistered from the
    /// transports when the last one ends.
    std::unordered_map<RegionId, std::shared_ptr<Region>> retiring_;
};

}  // namespace tensorlane::sidecar
