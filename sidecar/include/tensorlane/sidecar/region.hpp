// Registered memory regions and the table the engine and the transports share.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensorlane/ipc/shm.hpp"
#include "tensorlane/sidecar/status.hpp"

namespace tensorlane::sidecar {

using RegionId = uint64_t;
using SessionId = uint64_t;

/// Memory the sidecar can read and write on behalf of a client: a host buffer from AllocHost
/// (the sidecar maps it too) or a range of one. Kept alive by shared_ptr while any transfer uses
/// it, so a deregister during a transfer never unmaps memory under the transport.
struct Region {
    RegionId id = 0;
    SessionId owner = 0;
    RegionId parent = 0;            ///< the AllocHost buffer this range lies in (0: it is one)
    unsigned char *base = nullptr;  ///< the sidecar's address of the region's first byte
    uint64_t bytes = 0;
    std::shared_ptr<ipc::Mapping> mapping;  ///< keeps the memory mapped
    std::string exposed_name;          ///< empty: not exposed (engine thread and table lock only)
    std::atomic<bool> exposed{false};  ///< what transport threads check instead of the name
    std::atomic<bool> revoked{false};  ///< deregistered: no transfer may start on it

    /// True when [offset, offset + len) lies inside the region, overflow-safe, len > 0.
    bool contains(uint64_t offset, uint64_t len) const {
        return len > 0 && offset <= bytes && len <= bytes - offset;
    }
};

/// The sidecar's regions. The engine thread adds and removes; transport threads look up.
/// Lookups take a shared lock; nothing here is on the shared-memory request path's hot loop
/// except find(), which is a shared-lock hash lookup.
class RegionTable {
public:
    /// Adds a region and gives it a fresh id (never reused).
    RegionId add(std::shared_ptr<Region> r);
    /// Removes it, marks it revoked and returns it (nullptr if unknown).
    std::shared_ptr<Region> remove(RegionId id);
    /// The region, or nullptr.
    std::shared_ptr<Region> find(RegionId id) const;
    /// The exposed region named `name`, or nullptr.
    std::shared_ptr<Region> findExposed(const std::string &name) const;
    /// Exposes `id` under `name`. kInvalid if the name is taken by another region.
    Status expose(RegionId id, const std::string &name);
    /// Every exposed region (for bootstrap descriptors).
    std::vector<std::shared_ptr<Region>> exposed() const;
    /// Every region of one session.
    std::vector<std::shared_ptr<Region>> ofSession(SessionId s) const;
    uint64_t registeredBytes() const;
    size_t size() const;

private:
    mutable std::shared_mutex mu_;
    RegionId next_id_ = 1;
    std::unordered_map<RegionId, std::shared_ptr<Region>> by_id_;
    std::map<std::string, RegionId> by_name_;
};

}  // namespace tensorlane::sidecar
