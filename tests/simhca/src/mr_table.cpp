#include "mr_table.hpp"

#include <mutex>

#include "memory_region.hpp"

namespace tensorlane::simhca {

MrTable &MrTable::instance() {
    static MrTable table;
    return table;
}

uint32_t MrTable::reserve() {
    std::unique_lock lock(mutex_);
    uint32_t index;
    if (!free_.empty()) {
        index = free_.back();
        free_.pop_back();
    } else {
        index = static_cast<uint32_t>(slots_.size()) + 1;  // index 0 is never used: key 0 fails
        slots_.push_back(nullptr);
    }
    generation_ = static_cast<uint8_t>(generation_ * 33 + 7);
    return (index << 8) | generation_;
}

void MrTable::install(MemoryRegion *mr) {
    std::unique_lock lock(mutex_);
    slots_[(mr->key() >> 8) - 1] = mr;
}

void MrTable::remove(MemoryRegion *mr) {
    std::unique_lock lock(mutex_);
    const uint32_t index = mr->key() >> 8;
    slots_[index - 1] = nullptr;
    free_.push_back(index);
}

MemoryRegion *MrTable::lookupLocked(uint32_t key) const {
    const uint32_t index = key >> 8;
    if (index == 0 || index > slots_.size()) {
        return nullptr;
    }
    MemoryRegion *mr = slots_[index - 1];
    return mr != nullptr && mr->key() == key ? mr : nullptr;
}

}  // namespace tensorlane::simhca
