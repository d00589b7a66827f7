#include "tensorlane/sidecar/region.hpp"

#include <algorithm>

namespace tensorlane::sidecar {

std::string idList(const std::vector<uint32_t> &ids) {
    std::string out = "[";
    for (size_t i = 0; i < ids.size(); ++i) {
        out += (i == 0 ? "" : ", ") + std::to_string(ids[i]);
    }
    return out + "]";
}

bool RegionAccess::allows(uint32_t uid, const std::vector<uint32_t> &groups) const {
    if (uid == owner_uid || uid == 0 || any_local) {
        return true;
    }
    if (std::find(uids.begin(), uids.end(), uid) != uids.end()) {
        return true;
    }
    for (uint32_t g : gids) {
        if (std::find(groups.begin(), groups.end(), g) != groups.end()) {
            return true;
        }
    }
    return false;
}

std::string RegionAccess::describe() const {
    if (any_local) {
        return "every local client (TL_ACCESS_LOCAL_ANY)";
    }
    return "owner uid " + std::to_string(owner_uid) + " and root, uids " + idList(uids) +
           ", gids " + idList(gids);
}

const char *toString(MemoryKind k) {
    return k == MemoryKind::kCuda ? "cuda" : "host";
}

RegionId RegionTable::add(std::shared_ptr<Region> r) {
    if (r->id == 0) {
        r->id = takeId();
    }
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

Status RegionTable::expose(RegionId id, const std::string &name, RegionAccess access) {
    auto it = by_id_.find(id);
    if (it == by_id_.end()) {
        return {Code::kNotFound, "no region " + std::to_string(id)};
    }
    auto taken = by_name_.find(name);
    if (taken != by_name_.end() && taken->second != id) {
        // Never taken over, by anyone: the holder deregisters it first.
        auto holder = by_id_.find(taken->second);
        const std::string who =
            holder == by_id_.end()
                ? std::string()
                : " (owner uid " + std::to_string(holder->second->access.owner_uid) + ")";
        return {Code::kInvalid, "the name '" + name + "' is already exposed by region " +
                                    std::to_string(taken->second) + who +
                                    "; it is released when that region is deregistered"};
    }
    Region &r = *it->second;
    if (!r.exposed_name.empty() && r.access.peers && !access.peers) {
        return {Code::kInvalid, "region " + std::to_string(id) + " is offered to peers as '" +
                                    r.exposed_name +
                                    "' already; peers hold its descriptor, so it cannot be "
                                    "withdrawn from them: deregister it and register it again"};
    }
    if (!r.exposed_name.empty() && r.exposed_name != name) {
        by_name_.erase(r.exposed_name);
    }
    r.exposed_name = name;
    r.access = std::move(access);
    by_name_[name] = id;
    r.exposed.store(true, std::memory_order_release);
    return Status::ok();
}

std::vector<std::shared_ptr<Region>> RegionTable::exposed() const {
    std::vector<std::shared_ptr<Region>> out;
    out.reserve(by_name_.size());
    for (const auto &[name, id] : by_name_) {
        auto it = by_id_.find(id);
        if (it != by_id_.end() && it->second->access.peers) {
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
