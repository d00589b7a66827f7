#include "tensorlane/sidecar/region.hpp"

namespace tensorlane::sidecar {

RegionId RegionTable::add(std::shared_ptr<Region> r) {
    std::unique_lock lock(mu_);
    r->id = next_id_++;
    RegionId id = r->id;
    by_id_.emplace(id, std::move(r));
    return id;
}

std::shared_ptr<Region> RegionTable::remove(RegionId id) {
    std::unique_lock lock(mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) {
        return nullptr;
    }
    auto r = std::move(it->second);
    by_id_.erase(it);
    if (!r->exposed_name.empty()) {
        by_name_.erase(r->exposed_name);
    }
    // A transfer that already holds the shared_ptr may finish; none may start.
    r->revoked.store(true, std::memory_order_release);
    return r;
}

std::shared_ptr<Region> RegionTable::find(RegionId id) const {
    std::shared_lock lock(mu_);
    auto it = by_id_.find(id);
    return it == by_id_.end() ? nullptr : it->second;
}

std::shared_ptr<Region> RegionTable::findExposed(const std::string &name) const {
    std::shared_lock lock(mu_);
    auto it = by_name_.find(name);
    if (it == by_name_.end()) {
        return nullptr;
    }
    auto r = by_id_.find(it->second);
    return r == by_id_.end() ? nullptr : r->second;
}

Status RegionTable::expose(RegionId id, const std::string &name) {
    std::unique_lock lock(mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) {
        return {Code::kNotFound, "no region " + std::to_string(id)};
    }
    auto taken = by_name_.find(name);
    if (taken != by_name_.end() && taken->second != id) {
        return {Code::kInvalid, "the name '" + name + "' is already exposed by region " +
                                    std::to_string(taken->second)};
    }
    Region &r = *it->second;
    if (!r.exposed_name.empty() && r.exposed_name != name) {
        by_name_.erase(r.exposed_name);
    }
    r.exposed_name = name;
    by_name_[name] = id;
    r.exposed.store(true, std::memory_order_release);
    return Status::ok();
}

std::vector<std::shared_ptr<Region>> RegionTable::exposed() const {
    std::shared_lock lock(mu_);
    std::vector<std::shared_ptr<Region>> out;
    out.reserve(by_name_.size());
    for (const auto &[name, id] : by_name_) {
        auto it = by_id_.find(id);
        if (it != by_id_.end()) {
            out.push_back(it->second);
        }
    }
    return out;
}

std::vector<std::shared_ptr<Region>> RegionTable::ofSession(SessionId s) const {
    std::shared_lock lock(mu_);
    std::vector<std::shared_ptr<Region>> out;
    for (const auto &[id, r] : by_id_) {
        if (r->owner == s) {
            out.push_back(r);
        }
    }
    return out;
}

uint64_t RegionTable::registeredBytes() const {
    std::shared_lock lock(mu_);
    uint64_t total = 0;
    for (const auto &[id, r] : by_id_) {
        if (r->parent == 0) {
            total += r->bytes;
        }
    }
    return total;
}

size_t RegionTable::size() const {
    std::shared_lock lock(mu_);
    return by_id_.size();
}

}  // namespace tensorlane::sidecar
