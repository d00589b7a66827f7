#include "peer/directory.hpp"

namespace tensorlane::sidecar {

void RegionDirectory::bury(uint64_t handle, std::string reason) {
    auto it = handles_.find(handle);
    if (it == handles_.end()) {
        return;
    }
    handle_of_.erase({it->second.peer, it->second.incarnation, it->second.remote_id});
    handles_.erase(it);
    tombstones_[handle] = std::move(reason);
    tombstone_order_.push_back(handle);
    while (tombstone_order_.size() > max_tombstones_) {
        tombstones_.erase(tombstone_order_.front());
        tombstone_order_.pop_front();
    }
}

void RegionDirectory::replace(PeerId peer, uint64_t incarnation,
                              std::map<uint64_t, RegionDescriptor> regions) {
    PeerRegions &p = peers_[peer];
    const bool restarted = p.incarnation != 0 && p.incarnation != incarnation;
    // Handles of regions that are not in the new snapshot (or of the old run) are dead.
    std::vector<uint64_t> dead;
    for (const auto &[h, handle] : handles_) {
        if (handle.peer != peer) {
            continue;
        }
        if (restarted || handle.incarnation != incarnation ||
            regions.count(handle.remote_id) == 0) {
            dead.push_back(h);
        }
    }
    for (uint64_t h : dead) {
        bury(h, restarted ? "the region belongs to an earlier run of the peer (it restarted); "
                            "look it up again"
                          : "the peer revoked the region");
    }
    p = PeerRegions{};
    p.incarnation = incarnation;
    for (auto &[id, d] : regions) {
        if (p.by_id.size() >= max_regions_) {
            ++p.dropped;
            continue;
        }
        p.by_name[d.name] = id;
        p.by_id.emplace(id, std::move(d));
    }
}

void RegionDirectory::forget(PeerId peer, const std::string &reason) {
    std::vector<uint64_t> dead;
    for (const auto &[h, handle] : handles_) {
        if (handle.peer == peer) {
            dead.push_back(h);
        }
    }
    for (uint64_t h : dead) {
        bury(h, reason);
    }
    peers_.erase(peer);
}

bool RegionDirectory::add(PeerId peer, RegionDescriptor d) {
    PeerRegions &p = peers_[peer];
    auto old = p.by_id.find(d.id);
    if (old != p.by_id.end()) {
        auto byname = p.by_name.find(old->second.name);
        if (byname != p.by_name.end() && byname->second == d.id) {
            p.by_name.erase(byname);
        }
    } else if (p.by_id.size() >= max_regions_) {
        ++p.dropped;
        return false;
    }
    p.by_name[d.name] = d.id;
    const uint64_t id = d.id;
    p.by_id[id] = std::move(d);
    return true;
}

void RegionDirectory::remove(PeerId peer, uint64_t id) {
    auto pit = peers_.find(peer);
    if (pit == peers_.end()) {
        return;
    }
    PeerRegions &p = pit->second;
    auto it = p.by_id.find(id);
    if (it == p.by_id.end()) {
        return;
    }
    auto byname = p.by_name.find(it->second.name);
    if (byname != p.by_name.end() && byname->second == id) {
        p.by_name.erase(byname);
    }
    p.by_id.erase(it);
    auto h = handle_of_.find({peer, p.incarnation, id});
    if (h != handle_of_.end()) {
        bury(h->second, "the peer revoked the region");
    }
}

uint64_t RegionDirectory::dropped(PeerId peer) const {
    auto it = peers_.find(peer);
    return it == peers_.end() ? 0 : it->second.dropped;
}

std::optional<RemoteRegion> RegionDirectory::lookup(PeerId peer, const std::string &name) {
    auto pit = peers_.find(peer);
    if (pit == peers_.end()) {
        return std::nullopt;
    }
    PeerRegions &p = pit->second;
    auto it = p.by_name.find(name);
    if (it == p.by_name.end()) {
        return std::nullopt;
    }
    const RegionDescriptor &d = p.by_id.at(it->second);
    const auto key = std::make_tuple(peer, p.incarnation, d.id);
    uint64_t handle = 0;
    if (auto h = handle_of_.find(key); h != handle_of_.end()) {
        handle = h->second;
    } else {
        handle = next_handle_++;
        handles_.emplace(handle, Handle{peer, p.incarnation, d.id});
        handle_of_.emplace(key, handle);
    }
    return RemoteRegion{handle, d.bytes};
}

std::optional<RegionDirectory::Target> RegionDirectory::resolve(PeerId peer, RegionId handle,
                                                                std::string *why) const {
    auto it = handles_.find(handle);
    if (it == handles_.end() || it->second.peer != peer) {
        auto t = tombstones_.find(handle);
        *why = t != tombstones_.end() ? t->second : std::string("no such remote region");
        return std::nullopt;
    }
    auto pit = peers_.find(peer);
    if (pit == peers_.end() || pit->second.incarnation != it->second.incarnation) {
        *why = "the region belongs to an earlier run of the peer; look it up again";
        return std::nullopt;
    }
    auto d = pit->second.by_id.find(it->second.remote_id);
    if (d == pit->second.by_id.end()) {
        *why = "the peer revoked the region";
        return std::nullopt;
    }
    return Target{d->first, d->second.bytes};
}

size_t RegionDirectory::regionCount(PeerId peer) const {
    auto it = peers_.find(peer);
    return it == peers_.end() ? 0 : it->second.by_id.size();
}

}  // namespace tensorlane::sidecar
