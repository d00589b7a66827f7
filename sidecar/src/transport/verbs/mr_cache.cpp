#include "transport/verbs/mr_cache.hpp"

#include <cerrno>

#include <atomic>
#include <cstring>

#include "cuda/import.hpp"

namespace tensorlane::sidecar {

namespace {
std::atomic<uint64_t> g_next_job{1};

constexpr uint8_t kKeyRegion = 0;
constexpr uint8_t kKeyHostSegment = 1;
constexpr uint8_t kKeyCudaImport = 2;
constexpr uint8_t kKeyCudaDmabuf = 3;
constexpr uint64_t kPageMask = 4095;

uint64_t identity(const void *p) {
    return reinterpret_cast<uint64_t>(p);
}

/// Whether host region `r` lies inside the segment mapping it holds.
bool insideMapping(const Region &r) {
    if (!r.mapping || !*r.mapping || r.base == nullptr) {
        return false;
    }
    const auto *start = static_cast<const unsigned char *>(r.mapping->data());
    return r.base >= start && static_cast<uint64_t>(r.base - start) <= r.mapping->size() &&
           r.bytes <= r.mapping->size() - static_cast<uint64_t>(r.base - start);
}
}  // namespace

MrCache::MrCache(std::shared_ptr<ibv_pd> pd, Registrar &registrar, Scope scope)
    : pd_(std::move(pd)), registrar_(registrar), scope_(scope) {}

MrCache::~MrCache() {
    // MRs before the PD (the MrPtrs go with the entries; the PD's last owner may be us).
    entries_.clear();
}

MrCache::Key MrCache::keyOf(const Region &r, unsigned access, Scope scope) {
    if (scope == Scope::kRegion) {
        return Key{kKeyRegion, r.id, access};
    }
    if (r.kind == MemoryKind::kCuda) {
        // The sidecar's import of the allocation, shared by every region registered in it (the
        // client's addresses and keys name nothing here).
        if (r.cuda.import) {
            return Key{kKeyCudaImport, identity(r.cuda.import.get()), access};
        }
        if (r.cuda.dmabuf) {
            return Key{kKeyCudaDmabuf, identity(r.cuda.dmabuf.get()), access};
        }
        return Key{kKeyRegion, r.id, access};
    }
    // A tl_alloc_host buffer and its ranges share the segment's mapping.
    if (insideMapping(r)) {
        return Key{kKeyHostSegment, identity(r.mapping.get()), access};
    }
    return Key{kKeyRegion, r.id, access};
}

uint64_t MrCache::cudaRegionIova(const Region &r) {
    return (r.cuda.client_address & ~kPageMask) | (r.cuda.alloc_offset & kPageMask);
}

size_t MrCache::dmabufCount() const {
    size_t n = 0;
    for (const auto &[k, e] : entries_) {
        n += e.mr && e.dmabuf ? 1 : 0;
    }
    return n;
}

MrView MrCache::get(const Region &r, unsigned access, std::string *error) {
    const Key key = keyOf(r, access, scope_);
    auto it = entries_.find(key);
    if (it == entries_.end()) {
        Registrar::Job job;
        Entry e;
        if (!prepare(r, key, &job, &e, error)) {
            return {};
        }
        job.id = g_next_job.fetch_add(1);
        job.pd = pd_;
        job.access = access;
        e.job = job.id;
        by_job_[job.id] = key;
        it = entries_.emplace(key, std::move(e)).first;
        registrar_.submit(std::move(job));
    }
    Entry &e = it->second;
    if (e.users.insert(r.id).second) {
        keys_of_[r.id].push_back(key);
    }
    if (e.mr) {
        if (r.kind == MemoryKind::kHost) {
            // Host MRs are registered with iova = address.
            return MrView{e.mr.get(), reinterpret_cast<uint64_t>(r.base)};
        }
        const bool whole = key.kind == kKeyCudaImport || key.kind == kKeyCudaDmabuf;
        return MrView{e.mr.get(), e.base + (whole ? r.cuda.alloc_offset : 0)};
    }
    if (e.error != 0) {
        *error = std::string("memory registration failed: ") + std::strerror(e.error);
    }
    return {};  // still pending
}

bool MrCache::prepare(const Region &r, const Key &key, Registrar::Job *job, Entry *e,
                      std::string *error) const {
    if (r.kind == MemoryKind::kHost) {
        if (r.base == nullptr || r.bytes == 0) {
            *error = "a host region with no memory";
            return false;
        }
        unsigned char *start = r.base;
        uint64_t length = r.bytes;
        if (key.kind == kKeyHostSegment) {
            // A local key: the whole segment, whichever of its ranges asked first.
            start = static_cast<unsigned char *>(r.mapping->data());
            length = r.mapping->size();
        }
        job->addr = start;
        job->length = length;
        job->iova = identity(start);
        // A tl_alloc_host segment, or VMM host memory that its import keeps mapped.
        job->keepalive =
            r.mapping ? std::shared_ptr<void>(r.mapping) : std::shared_ptr<void>(r.cuda.import);
        e->base = job->iova;
        e->keepalive = job->keepalive;
        return true;
    }
    const CudaMemory &c = r.cuda;
    if (r.bytes == 0 || c.alloc_offset > c.alloc_bytes ||
        r.bytes > c.alloc_bytes - c.alloc_offset) {
        *error = "a CUDA region outside its allocation";
        return false;
    }
    const bool whole = key.kind == kKeyCudaImport || key.kind == kKeyCudaDmabuf;
    // The region alone (a remote key), or the whole allocation (a local key). The iova is the
    // owner's address whichever path registers it (the HCA does not care what number names the
    // memory; peers see the owner's addresses).
    const uint64_t offset = whole ? 0 : c.alloc_offset;
    job->length = whole ? c.alloc_bytes : r.bytes;
    job->iova = whole ? (c.client_address - c.alloc_offset) & ~kPageMask : cudaRegionIova(r);
    if (c.dmabuf && c.dmabuf->get() >= 0) {
        // The owner's dma-buf fd of the whole allocation (DESIGN.md step 2), at the range's
        // offset in it: no nvidia-peermem needed.
        job->dmabuf_fd = c.dmabuf->get();
        job->dmabuf_offset = offset;
        e->dmabuf = true;
    }
    if (c.import) {
        // nvidia-peermem: the sidecar's own mapping of the allocation (an IPC import, made on
        // the registrar's thread), when there is no fd or the host refuses dma-buf MRs.
        std::shared_ptr<CudaImport> imp = c.import;
        job->peermem_addr = [imp, offset](void **addr) {
            uint64_t base = 0;
            if (Status st = imp->base(&base); !st.isOk() || base == 0) {
                return EFAULT;
            }
            *addr = reinterpret_cast<void *>(base + offset);
            return 0;
        };
        job->keepalive = imp;
    } else if (!e->dmabuf) {
        *error = "a CUDA region with neither a dma-buf fd nor an IPC handle";
        return false;
    } else {
        job->keepalive = c.dmabuf;
    }
    e->base = job->iova;
    e->keepalive = job->keepalive;
    return true;
}

bool MrCache::complete(Registrar::Result &result) {
    if (result.pd != pd_) {
        return false;
    }
    auto j = by_job_.find(result.id);
    if (j == by_job_.end()) {
        // Released while it was being registered: let the MR go.
        if (result.mr != nullptr) {
            (void)ibv_dereg_mr(result.mr);
            result.mr = nullptr;
        }
        return true;
    }
    auto it = entries_.find(j->second);
    by_job_.erase(j);
    if (it == entries_.end()) {
        if (result.mr != nullptr) {
            (void)ibv_dereg_mr(result.mr);
            result.mr = nullptr;
        }
        return true;
    }
    it->second.mr.reset(result.mr);
    it->second.error = result.error;
    it->second.dmabuf = result.mr != nullptr && result.dmabuf;
    result.mr = nullptr;
    return true;
}

void MrCache::release(RegionId id) {
    auto k = keys_of_.find(id);
    if (k == keys_of_.end()) {
        return;
    }
    for (const Key &key : k->second) {
        auto it = entries_.find(key);
        if (it == entries_.end()) {
            continue;
        }
        it->second.users.erase(id);
        if (it->second.users.empty()) {
            by_job_.erase(it->second.job);
            entries_.erase(it);  // ibv_dereg_mr: the HCA refuses its key from now on
        }
    }
    keys_of_.erase(k);
}

}  // namespace tensorlane::sidecar
