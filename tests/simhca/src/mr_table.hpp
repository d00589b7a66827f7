// The process-wide key table: lkey/rkey to region, as the HCA's memory translation table. Keys
// are an index in the high 24 bits and a varying low byte (the "key" part of an IB L_Key,
// IB spec 10.6.3.1), so a stale key of a reused index does not match.
#pragma once

#include <cstdint>
#include <shared_mutex>
#include <vector>

namespace tensorlane::simhca {

class MemoryRegion;

/// Key to region.
class MrTable {
public:
    /// The process-wide table.
    static MrTable &instance();
    /// A fresh key for a region about to be created.
    [[nodiscard]] uint32_t reserve();
    /// Installs a region under its key.
    void install(MemoryRegion *mr);
    /// Removes a region (waits for lookups in progress: they hold the shared lock).
    void remove(MemoryRegion *mr);
    /// The lock lookups hold while they use a region.
    [[nodiscard]] std::shared_mutex &mutex() { return mutex_; }
    /// The region with this key, or nullptr; the caller holds mutex() shared.
    [[nodiscard]] MemoryRegion *lookupLocked(uint32_t key) const;

private:
    std::shared_mutex mutex_;
    std::vector<MemoryRegion *> slots_;
    std::vector<uint32_t> free_;
    uint8_t generation_ = 0x5a;
};

}  // namespace tensorlane::simhca
