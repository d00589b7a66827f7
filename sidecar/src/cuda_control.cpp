// The registration of CUDA memory (docs/gpu.md): a range of a client's cuMemAlloc/cudaMalloc
// allocation, with the allocation's IPC handle and dma-buf fd the first time, and only the
// allocation's key for every later range in it (no export; the import is shared).
#include <cstring>

#include "cuda/import.hpp"
#include "cuda/runtime.hpp"
#include "engine_impl.hpp"

namespace tensorlane::sidecar {
namespace {

std::string uuidText(const unsigned char *u) {
    static const char *hex = "0123456789abcdef";
    std::string s = "GPU-";
    for (int i = 0; i < 16; ++i) {
        if (i == 4 || i == 6 || i == 8 || i == 10) {
            s += '-';
        }
        s += hex[u[i] >> 4];
        s += hex[u[i] & 15];
    }
    return s;
}

}  // namespace

void EngineImpl::onRegisterCuda(Session &s, const ipc::RegisterMsg &m, ipc::UniqueFd dmabuf) {
    const auto refuse = [&](Code code, const std::string &why) {
        reply(s, m.h.seq, code, 0, 0, "tl_register: " + why);
    };
    CudaRuntime &rt = CudaRuntime::get();
    if (!rt.available()) {
        return refuse(Code::kCuda, "this sidecar cannot use CUDA memory: " + rt.why());
    }
    constexpr uint32_t kKnownFlags = ipc::kRegisterReuse | ipc::kRegisterDmabuf;
    const bool reuse = (m.flags & ipc::kRegisterReuse) != 0;
    const bool with_fd = (m.flags & ipc::kRegisterDmabuf) != 0;
    if ((m.flags & ~kKnownFlags) != 0 || (reuse && with_fd) || with_fd != bool(dmabuf)) {
        return refuse(Code::kInvalid, "flags and file descriptors of a CUDA registration disagree");
    }
    if (m.bytes == 0 || m.alloc_bytes == 0 || m.offset > m.alloc_bytes ||
        m.bytes > m.alloc_bytes - m.offset) {
        return refuse(Code::kInvalid, "range outside its CUDA allocation");
    }
    if (Status q = checkQuota(s, 0, false); !q.isOk()) {
        ++counters_.quota_refusals;
        return refuse(q.code(), q.message());
    }
    std::shared_ptr<CudaImport> imp;
    if (auto it = s.cuda_allocs.find(m.parent); it != s.cuda_allocs.end()) {
        imp = it->second.lock();
    }
    if (imp && imp->allocBytes() != m.alloc_bytes) {
        return refuse(Code::kInvalid, "the allocation's size changed under the same key");
    }
    if (reuse && !imp) {
        // The client exports again and retries (its record outlived ours).
        return refuse(Code::kNotFound, "the sidecar no longer holds this CUDA allocation");
    }
    if (!imp) {
        CudaUuid uuid;
        std::memcpy(uuid.data(), m.device_uuid, uuid.size());
        const int ordinal = rt.ordinalOf(uuid);
        if (ordinal < 0) {
            return refuse(Code::kCuda, "the GPU of this memory (" + uuidText(m.device_uuid) +
                                           ") is not visible to the sidecar (its "
                                           "CUDA_VISIBLE_DEVICES?)");
        }
        std::shared_ptr<ipc::UniqueFd> fd;
        if (dmabuf) {
            fd = std::make_shared<ipc::UniqueFd>(std::move(dmabuf));
        } else {
            log_->info(
                "session {} (pid {}): no dma-buf fd for a CUDA allocation of {} bytes on {}: "
                "{}; RDMA to it needs nvidia-peermem",
                s.id, s.cred.pid, m.alloc_bytes, rt.deviceName(ordinal),
                m.dmabuf_error != 0 ? CudaRuntime::errorText(m.dmabuf_error)
                                    : std::string("the client sent none"));
        }
        CudaIpcHandle handle;
        std::memcpy(handle.data(), m.cuda_ipc_handle, handle.size());
        imp = std::make_shared<CudaImport>(handle, ordinal, m.alloc_bytes, std::move(fd));
        if (s.cuda_allocs.size() >= 64 && (s.cuda_allocs.size() & 63) == 0) {
            std::erase_if(s.cuda_allocs, [](const auto &kv) { return kv.second.expired(); });
        }
        s.cuda_allocs[m.parent] = imp;
    }
    // else: a full export of an allocation we still hold (the client's record of it was gone):
    // ours stays, and the new fd closes with `dmabuf` here.
    auto r = std::make_shared<Region>();
    r->owner = s.id;
    r->kind = MemoryKind::kCuda;
    r->bytes = m.bytes;
    r->cuda.device = m.device_ordinal;
    r->cuda.ipc_handle = imp->handle();
    r->cuda.dmabuf = imp->dmabuf();
    r->cuda.alloc_bytes = m.alloc_bytes;
    r->cuda.alloc_offset = m.offset;
    r->cuda.client_address = m.address;
    r->cuda.import = imp;
    if (Status st = registerWithTransports(*r); !st.isOk()) {
        return refuse(st.code(), st.message());
    }
    const RegionId id = regions_.add(r);
    reply(s, m.h.seq, Code::kOk, id, r->bytes, "");
}

}  // namespace tensorlane::sidecar
