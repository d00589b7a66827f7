#include "region_table.hpp"

#include <iterator>
#include <mutex>

#include "cuda_memory.hpp"

namespace tensorlane::shim {

RegionTable::~RegionTable() {
    for (auto &[base, buf] : buffers_) {
        if (buf.pinned) {
            unpinHostForCuda(buf.mapping->data());
        }
    }
}

void RegionTable::addHostBuffer(tl_region r, size_t bytes, std::unique_ptr<ipc::Mapping> mapping,
                                bool pinned) {
    auto *base = static_cast<unsigned char *>(mapping->data());
    std::unique_lock lock(mu_);
    regions_[r] = LocalRegion{base, bytes, 0};
    buffers_[reinterpret_cast<uintptr_t>(base)] = HostBuffer{r, std::move(mapping), pinned};
}

bool RegionTable::findHostBuffer(uintptr_t addr, size_t bytes, tl_region *parent,
                                 uint64_t *offset) const {
    std::shared_lock lock(mu_);
    auto it = buffers_.upper_bound(addr);
    if (it != buffers_.begin()) {
        --it;
        const uint64_t size = it->second.mapping->size();
        const uint64_t off = addr - it->first;
        if (off < size && bytes <= size - off) {
            *parent = it->second.region;
            *offset = off;
            return true;
        }
    }
    return false;
}

void RegionTable::addRange(tl_region r, void *ptr, size_t bytes, tl_region parent) {
    std::unique_lock lock(mu_);
    regions_[r] = LocalRegion{static_cast<unsigned char *>(ptr), bytes, parent};
}

void RegionTable::addCuda(tl_region r, void *ptr, size_t bytes, uint64_t cuda_key) {
    std::unique_lock lock(mu_);
    regions_[r] = LocalRegion{static_cast<unsigned char *>(ptr), bytes, 0, true, cuda_key};
}

bool RegionTable::contains(tl_region r) const {
    std::shared_lock lock(mu_);
    return regions_.count(r) != 0;
}

void RegionTable::erase(tl_region r, const std::function<void(uint64_t)> &drop_cuda) {
    HostBuffer gone;
    {
        std::unique_lock lock(mu_);
        auto it = regions_.find(r);
        if (it != regions_.end() && it->second.cuda) {
            drop_cuda(it->second.cuda_key);
        } else if (it != regions_.end() && it->second.parent == 0) {
            // A tl_alloc_host buffer: its ranges went with it at the sidecar; unmap it here too.
            for (auto ri = regions_.begin(); ri != regions_.end();) {
                ri = ri->second.parent == r ? regions_.erase(ri) : std::next(ri);
            }
            auto bi = buffers_.find(reinterpret_cast<uintptr_t>(it->second.base));
            if (bi != buffers_.end()) {
                gone = std::move(bi->second);
                buffers_.erase(bi);
            }
        }
        regions_.erase(r);
    }
    // Unpinned with the table unlocked: cuMemHostUnregister waits for the GPU work of this
    // process, and that work may wait for another thread's write (a NCCL kernel for its
    // proxy's next send), which needs the table.
    if (gone.mapping && gone.pinned) {
        unpinHostForCuda(gone.mapping->data());
    }
}

void RegionTable::addRemote(tl_remote r, uint64_t bytes) {
    std::unique_lock lock(mu_);
    remotes_[r] = bytes;
}

bool RegionTable::remoteBytes(tl_remote r, uint64_t *bytes) const {
    std::shared_lock lock(mu_);
    auto it = remotes_.find(r);
    if (it == remotes_.end()) {
        return false;
    }
    *bytes = it->second;
    return true;
}

bool RegionTable::checkWrites(const tl_write_desc *w, size_t n, size_t *bad,
                              std::string *why) const {
    std::shared_lock lock(mu_);
    for (size_t i = 0; i < n; ++i) {
        if (!validWrite(w[i], why)) {
            *bad = i;
            return false;
        }
    }
    return true;
}

bool RegionTable::validWrite(const tl_write_desc &w, std::string *why) const {
    if (w.bytes == 0) {
        *why = "zero bytes";
        return false;
    }
    auto s = regions_.find(w.src);
    if (s == regions_.end()) {
        *why = "unknown source region " + std::to_string(w.src);
        return false;
    }
    if (w.src_off > s->second.bytes || w.bytes > s->second.bytes - w.src_off) {
        *why = "source offset + bytes past the region's end";
        return false;
    }
    auto d = remotes_.find(w.dst);
    if (d == remotes_.end()) {
        *why = "unknown remote " + std::to_string(w.dst) + " (not from tl_lookup)";
        return false;
    }
    if (w.dst_off > d->second || w.bytes > d->second - w.dst_off) {
        *why = "target offset + bytes past the region's end";
        return false;
    }
    return true;
}

}  // namespace tensorlane::shim
