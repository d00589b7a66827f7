#include "cuda_registrar.hpp"

#include <sys/epoll.h>
#include <unistd.h>

#include <cstring>

#include "cuda/import.hpp"
#include "cuda/import_checker.hpp"
#include "cuda/runtime.hpp"
#include "epoll_tags.hpp"
#include "logging.hpp"
#include "region_lifecycle.hpp"

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

CudaRegistrar::CudaRegistrar(int epoll_fd, SessionTable &sessions, RegionLifecycle &lifecycle,
                             Reply reply)
    : epoll_fd_(epoll_fd),
      sessions_(sessions),
      lifecycle_(lifecycle),
      reply_(std::move(reply)),
      log_(sidecarLogger()) {}

CudaRegistrar::~CudaRegistrar() = default;

void CudaRegistrar::registerCuda(Session &s, const ipc::RegisterMsg &m, ipc::UniqueFd dmabuf) {
    const auto refuse = [&](Code code, const std::string &why) {
        reply_(s, m.h.seq, code, 0, 0, "tl_register: " + why);
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
    if (Status q = lifecycle_.checkQuota(s, 0, false); !q.isOk()) {
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
    if (imp) {
        // Verified when it was first registered (only verified imports are kept in
        // cuda_allocs). A full export of an allocation we still hold (the client's record of
        // it was gone): ours stays, and the new fd closes with `dmabuf` here.
        return addRegion(s, m, imp);
    }
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
        // The owner exports the whole allocation, rounded up to whole pages; the fd's size is
        // the kernel's (a dma-buf's llseek(SEEK_END) gives its size), so a claim larger than the
        // allocation is caught here, before a transport registers an MR on it.
        const off_t size = ::lseek(dmabuf.get(), 0, SEEK_END);
        const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
        const uint64_t span = (m.alloc_bytes + page - 1) & ~(page - 1);
        if (size < 0 || static_cast<uint64_t>(size) != span) {
            return refuse(Code::kInvalid, "the dma-buf fd of the allocation holds " +
                                              (size < 0 ? std::string("an unknown number of")
                                                        : std::to_string(size)) +
                                              " bytes; the client says the allocation holds " +
                                              std::to_string(m.alloc_bytes) + " (" +
                                              std::to_string(span) + " in whole pages)");
        }
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
    imp = std::make_shared<CudaImport>(handle, ordinal, m.alloc_bytes, std::move(fd), s.cred.uid);
    // The client's numbers are checked against the sidecar's own import of the allocation, on
    // the checker's thread (the import may take milliseconds); the reply waits for it.
    if (!checker_) {
        Status st;
        checker_ = CudaImportChecker::create(&st);
        if (!checker_) {
            return refuse(st.code(), st.message());
        }
        if (int rc = addToEpoll(epoll_fd_, checker_->fd(), EPOLLIN, kTagCudaCheck)) {
            checker_.reset();
            return refuse(Code::kInternal, std::string("epoll_ctl: ") + std::strerror(rc));
        }
    }
    checker_->submit({s.id, m, std::move(imp)});
}

void CudaRegistrar::finishChecks() {
    if (!checker_) {
        return;
    }
    for (CudaImportChecker::Result &res : checker_->take()) {
        Session *s = sessions_.find(res.job.session);
        if (s == nullptr || s->closing) {
            continue;  // the client went away meanwhile: the import goes with the job
        }
        const ipc::RegisterMsg &m = res.job.msg;
        if (!res.status.isOk()) {
            log_->warn("session {} (pid {}, uid {}): CUDA registration refused: {}", s->id,
                       s->cred.pid, s->cred.uid, res.status.message());
            reply_(*s, m.h.seq, res.status.code(), 0, 0, "tl_register: " + res.status.message());
            continue;
        }
        if (s->cuda_allocs.size() >= 64 && (s->cuda_allocs.size() & 63) == 0) {
            std::erase_if(s->cuda_allocs, [](const auto &kv) { return kv.second.expired(); });
        }
        s->cuda_allocs[m.parent] = res.job.import;
        addRegion(*s, m, res.job.import);
    }
}

void CudaRegistrar::addRegion(Session &s, const ipc::RegisterMsg &m,
                              const std::shared_ptr<CudaImport> &imp) {
    RegionId id = 0;
    if (Status st = lifecycle_.addCuda(s, m, imp, &id); !st.isOk()) {
        reply_(s, m.h.seq, st.code(), 0, 0, "tl_register: " + st.message());
        return;
    }
    reply_(s, m.h.seq, Code::kOk, id, m.bytes, "");
}

}  // namespace tensorlane::sidecar
