#include "tensorlane/sidecar/region.hpp"

namespace tensorlane::sidecar {

const char *toString(MemoryKind k) {
    return k == MemoryKind::kCuda ? "cuda" : "host";
}

RegionId RegionTable::add(std::shared_ptr<Region> r) {
    r->id = next_id_++;
    RegionId id = r->id;
    by_session_[r->owner][id] = r.get();
    if (r->parent == 0) {
        host_bytes_ += r->bytes;
    }
    by_id_.emplace(id, std::move(r));
    return id;
}

std::shared_ptr<Region> RegionTable::remove(RegionId id) {
    auto it = by_id_.find(id);
    if (it == by_id_.end()) {
        return nullptr;
    }
    auto r = std::move(it->second);
    by_id_.erase(it);
    auto sit = by_session_.find(r->owner);
    if (sit != by_session_.end()) {
        sit->second.erase(id);
        if (sit->second.empty()) {
            by_session_.erase(sit);
        }
    }
    if (r->parent == 0) {
        host_bytes_ -= r->bytes;
    }
    if (!r->exposed_name.empty()) {
        by_name_.erase(r->exposed_name);
    }
    // A transfer that already holds the shared_ptr may finish; none may start.
    r->revoked.store(true, std::memory_order_release);
    return r;
}

std::shared_ptr<Region> RegionTable::find(RegionId id) const {
    auto it = by_id_.find(id);
    return it == by_id_.end() ? nullptr : it->second;
}

std::shared_ptr<Region> RegionTable::findExposed(const std::string &name) const {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) {
        return nullptr;
    }
    auto r = by_id_.find(it->second);
    return r == by_id_.end() ? nullptr : r->second;
}

Status RegionTable::expose(RegionId id, const std::string &name) {
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
    std::vector<std::shared_ptr<Region>> out;
    auto it = by_session_.find(s);
    if (it == by_session_.end()) {
        return out;
    }
    out.reserve(it->second.size());
    for (const auto &[id, r] : it->second) {
        out.push_back(by_id_.at(id));
    }
    return out;
}

size_t RegionTable::countOfSession(SessionId s) const {
    auto it = by_session_.find(s);
    return it == by_session_.end() ? 0 : it->second.size();
}

uint64_t RegionTable::registeredBytes() const {
    return host_bytes_;
}

size_t RegionTable::size() const {
    return by_id_.size();
}

}  // namespace tensorlane::sidecar
