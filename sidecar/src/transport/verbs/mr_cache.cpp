#include "transport/verbs/mr_cache.hpp"

#include <cerrno>

#include <atomic>
#include <cstring>

#include "cuda/import.hpp"

namespace tensorlane::sidecar {

namespace {
std::atomic<uint64_t> g_next_job{1};
}  // namespace

MrCache::MrCache(std::shared_ptr<ibv_pd> pd, Registrar &registrar, RegionTable &regions)
    : pd_(std::move(pd)), registrar_(registrar), regions_(regions) {}

MrCache::~MrCache() {
    // MRs before the PD (the MrPtrs go with the entries; the PD's last owner may be us).
    entries_.clear();
}

uint64_t MrCache::rootOf(const Region &r) {
    if (r.kind == MemoryKind::kCuda) {
        // One allocation, one dma-buf fd shared by every region registered inside it.
        if (r.cuda.dmabuf) {
            return reinterpret_cast<uint64_t>(r.cuda.dmabuf.get());
        }
        return r.cuda.client_address - r.cuda.alloc_offset;
    }
    return r.parent != 0 ? r.parent : r.id;
}

size_t MrCache::dmabufCount() const {
    size_t n = 0;
    for (const auto &[k, e] : entries_) {
        n += e.mr && e.dmabuf ? 1 : 0;
    }
    return n;
}

MrView MrCache::get(const Region &r, unsigned access, std::string *error) {
    const uint64_t root = rootOf(r);
    const Key key{root, access};
    auto it = entries_.find(key);
    if (it != entries_.end()) {
        Entry &e = it->second;
        if (e.mr) {
            const uint64_t offset = r.kind == MemoryKind::kCuda
                                        ? r.cuda.alloc_offset
                                        : reinterpret_cast<uint64_t>(r.base) - e.base;
            return MrView{e.mr.get(), e.base + offset};
        }
        if (e.error != 0) {
            *error = std::string("memory registration failed: ") + std::strerror(e.error);
        }
        return {};  // still pending
    }
    Registrar::Job job;
    job.id = g_next_job.fetch_add(1);
    job.pd = pd_;
    job.access = access;
    Entry e;
    e.job = job.id;
    if (r.kind == MemoryKind::kCuda) {
        // The iova is the owner's address of the allocation whichever path registers it (the
        // HCA does not care what number names the memory; peers see the owner's addresses).
        job.iova = r.cuda.client_address - r.cuda.alloc_offset;
        job.length = r.cuda.alloc_bytes;
        if (r.cuda.dmabuf && r.cuda.dmabuf->get() >= 0) {
            // The owner's dma-buf fd of the whole allocation (DESIGN.md step 2): no
            // nvidia-peermem needed.
            job.dmabuf_fd = r.cuda.dmabuf->get();
            job.dmabuf_offset = 0;
            e.dmabuf = true;
        }
        if (r.cuda.import) {
            // nvidia-peermem: the sidecar's own mapping of the allocation (an IPC import, made
            // on the registrar's thread), when there is no fd or the host refuses dma-buf MRs.
            std::shared_ptr<CudaImport> imp = r.cuda.import;
            job.peermem_addr = [imp](void **addr) {
                uint64_t base = 0;
                if (Status st = imp->base(&base); !st.isOk() || base == 0) {
                    return EFAULT;
                }
                *addr = reinterpret_cast<void *>(base);
                return 0;
            };
            job.keepalive = imp;
        } else if (!e.dmabuf) {
            *error = "a CUDA region with neither a dma-buf fd nor an IPC handle";
            return {};
        } else {
            job.keepalive = r.cuda.dmabuf;
        }
    } else {
        std::shared_ptr<Region> root_region = regions_.find(root);
        const Region &owner = root_region ? *root_region : r;
        job.addr = owner.base;
        job.length = owner.bytes;
        job.iova = reinterpret_cast<uint64_t>(owner.base);
        job.keepalive = owner.mapping;
    }
    e.base = job.iova;
    e.keepalive = job.keepalive;
    by_job_[job.id] = key;
    entries_.emplace(key, std::move(e));
    registrar_.submit(std::move(job));
    return {};
}

bool MrCache::complete(Registrar::Result &result) {
    if (result.pd != pd_) {
        return false;
    }
    auto j = by_job_.find(result.id);
    if (j == by_job_.end()) {
        // An allocation dropped while it was being registered: let the MR go.
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

void MrCache::dropAllocation(uint64_t root) {
    for (auto it = entries_.begin(); it != entries_.end();) {
        if (it->first.first == root) {
            by_job_.erase(it->second.job);
            it = entries_.erase(it);
        } else {
            ++it;
        }
    }
}

}  // namespace tensorlane::sidecar
