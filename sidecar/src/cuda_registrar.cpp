#include "cuda_registrar.hpp"

#include <sys/epoll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
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

void CudaRegistrar::stagePieces(Session &s, const ipc::VmmPiecesMsg &m, ipc::UniqueFd *fds,
                                size_t nfds) {
    const auto refuse = [&](const std::string &why) {
        // The registration's staging goes with the refusal (its fds close here): the client
        // starts again with a new key.
        if (auto it = s.vmm_staged.find(m.key); it != s.vmm_staged.end()) {
            s.vmm_staged_pieces -= it->second.size();
            s.vmm_staged.erase(it);
        }
        reply_(s, m.h.seq, Code::kInvalid, 0, 0, "tl_register (VMM pieces): " + why);
    };
    if (m.count == 0 || m.count > ipc::kMaxVmmPiecesPerMessage || nfds != m.count) {
        return refuse(std::to_string(m.count) + " pieces with " + std::to_string(nfds) +
                      " file descriptors (1.." + std::to_string(ipc::kMaxVmmPiecesPerMessage) +
                      ", one fd each)");
    }
    std::vector<VmmPieceFd> &staged = s.vmm_staged[m.key];
    if (m.first != staged.size()) {
        return refuse("batch starts at piece " + std::to_string(m.first) + "; " +
                      std::to_string(staged.size()) + " are staged");
    }
    if (s.vmm_staged_pieces + m.count > ipc::kMaxVmmPieces) {
        return refuse("more than " + std::to_string(ipc::kMaxVmmPieces) +
                      " VMM pieces staged by this client");
    }
    // Contiguous from 0, each non-empty, the span bounded (no sum overflows).
    constexpr uint64_t kMaxSpan = uint64_t{1} << 48;
    uint64_t next = staged.empty() ? 0 : staged.back().offset + staged.back().bytes;
    for (uint32_t i = 0; i < m.count; ++i) {
        const ipc::VmmPiece &p = m.pieces[i];
        if (p.offset != next || p.bytes == 0 || p.bytes > kMaxSpan - next) {
            return refuse("piece " + std::to_string(m.first + i) + " (" + std::to_string(p.bytes) +
                          " bytes at " + std::to_string(p.offset) +
                          ") does not follow the pieces before it, or is empty");
        }
        next += p.bytes;
    }
    for (uint32_t i = 0; i < m.count; ++i) {
        staged.push_back(VmmPieceFd{m.pieces[i].offset, m.pieces[i].bytes, std::move(fds[i])});
    }
    s.vmm_staged_pieces += m.count;
    reply_(s, m.h.seq, Code::kOk, staged.size(), next, "");
}

Status CudaRegistrar::checkDmabufSize(int fd, uint64_t alloc_bytes) {
    // The owner exports the whole allocation, rounded up to whole pages; the fd's size is
    // the kernel's (a dma-buf's llseek(SEEK_END) gives its size), so a claim larger than the
    // allocation is caught here, before a transport registers an MR on it.
    const off_t size = ::lseek(fd, 0, SEEK_END);
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const uint64_t span = (alloc_bytes + page - 1) & ~(page - 1);
    if (size < 0 || static_cast<uint64_t>(size) != span) {
        return {Code::kInvalid,
                "the dma-buf fd of the allocation holds " +
                    (size < 0 ? std::string("an unknown number of") : std::to_string(size)) +
                    " bytes; the client says the allocation holds " + std::to_string(alloc_bytes) +
                    " (" + std::to_string(span) + " in whole pages)"};
    }
    return Status::ok();
}

void CudaRegistrar::registerCuda(Session &s, const ipc::RegisterMsg &m, ipc::UniqueFd dmabuf) {
    const auto refuse = [&](Code code, const std::string &why) {
        reply_(s, m.h.seq, code, 0, 0, "tl_register: " + why);
    };
    constexpr uint32_t kKnownFlags = ipc::kRegisterReuse | ipc::kRegisterDmabuf |
                                     ipc::kRegisterVmm | ipc::kRegisterDmabufOnly |
                                     ipc::kRegisterVmmHost;
    const bool reuse = (m.flags & ipc::kRegisterReuse) != 0;
    const bool with_fd = (m.flags & ipc::kRegisterDmabuf) != 0;
    const bool vmm = (m.flags & ipc::kRegisterVmm) != 0;
    const bool dmabuf_only = (m.flags & ipc::kRegisterDmabufOnly) != 0;
    const bool vmm_host = (m.flags & ipc::kRegisterVmmHost) != 0;
    if (vmm_host && !vmm) {
        return refuse(Code::kInvalid, "host memory by VMM without its VMM pieces");
    }
    if (vmm) {
        // The staged pieces are this registration's, whatever becomes of it.
        std::vector<VmmPieceFd> pieces;
        if (auto it = s.vmm_staged.find(m.parent); it != s.vmm_staged.end()) {
            pieces = std::move(it->second);
            s.vmm_staged_pieces -= pieces.size();
            s.vmm_staged.erase(it);
        }
        if ((m.flags & ~kKnownFlags) != 0 || reuse || dmabuf_only || with_fd != bool(dmabuf)) {
            return refuse(Code::kInvalid,
                          "flags and file descriptors of a CUDA registration disagree");
        }
        if (pieces.empty()) {
            return refuse(Code::kNotFound, "no VMM pieces were staged for this registration");
        }
        const uint64_t span = pieces.back().offset + pieces.back().bytes;
        if (span != m.alloc_bytes) {
            return refuse(Code::kInvalid, "the staged VMM pieces span " + std::to_string(span) +
                                              " bytes; the registration says " +
                                              std::to_string(m.alloc_bytes));
        }
        return registerVmm(s, m, std::move(pieces), std::move(dmabuf), vmm_host);
    }
    if (dmabuf_only) {
        if ((m.flags & ~kKnownFlags) != 0 || reuse || !with_fd || !dmabuf) {
            return refuse(Code::kInvalid,
                          "flags and file descriptors of a CUDA registration disagree");
        }
        return registerDmabufOnly(s, m, std::move(dmabuf));
    }
    CudaRuntime &rt = CudaRuntime::get();
    if (!rt.available()) {
        return refuse(Code::kCuda, "this sidecar cannot use CUDA memory: " + rt.why());
    }
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
        if (Status st = checkDmabufSize(dmabuf.get(), m.alloc_bytes); !st.isOk()) {
            return refuse(st.code(), st.message());
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
    submitCheck(
        s, m,
        std::make_shared<CudaImport>(handle, ordinal, m.alloc_bytes, std::move(fd), s.cred.uid));
}

void CudaRegistrar::registerVmm(Session &s, const ipc::RegisterMsg &m,
                                std::vector<VmmPieceFd> pieces, ipc::UniqueFd dmabuf, bool host) {
    const auto refuse = [&](Code code, const std::string &why) {
        reply_(s, m.h.seq, code, 0, 0, "tl_register: " + why);
    };
    CudaRuntime &rt = CudaRuntime::get();
    if (!rt.available()) {
        return refuse(Code::kCuda, "this sidecar cannot use CUDA memory: " + rt.why());
    }
    if (m.bytes == 0 || m.offset > m.alloc_bytes || m.bytes > m.alloc_bytes - m.offset) {
        return refuse(Code::kInvalid, "range outside its VMM pieces");
    }
    if (Status q = lifecycle_.checkQuota(s, 0, false); !q.isOk()) {
        return refuse(q.code(), q.message());
    }
    // Host memory belongs to no GPU: any context of the sidecar's maps it (its first device's).
    CudaUuid uuid;
    std::memcpy(uuid.data(), m.device_uuid, uuid.size());
    const int ordinal = host ? 0 : rt.ordinalOf(uuid);
    if (ordinal < 0) {
        return refuse(Code::kCuda, "the GPU of this memory (" + uuidText(m.device_uuid) +
                                       ") is not visible to the sidecar (its "
                                       "CUDA_VISIBLE_DEVICES?)");
    }
    std::shared_ptr<ipc::UniqueFd> fd;
    if (dmabuf) {
        if (Status st = checkDmabufSize(dmabuf.get(), m.alloc_bytes); !st.isOk()) {
            return refuse(st.code(), st.message());
        }
        fd = std::make_shared<ipc::UniqueFd>(std::move(dmabuf));
    }
    // Verified by mapping every piece whole at the size the client gives (the checker's
    // thread); never kept for reuse: each VMM registration brings its own pieces.
    submitCheck(s, m,
                std::make_shared<CudaImport>(std::move(pieces), ordinal, m.alloc_bytes,
                                             m.alloc_address, std::move(fd), host));
}

void CudaRegistrar::registerDmabufOnly(Session &s, const ipc::RegisterMsg &m,
                                       ipc::UniqueFd dmabuf) {
    const auto refuse = [&](Code code, const std::string &why) {
        reply_(s, m.h.seq, code, 0, 0, "tl_register_dmabuf: " + why);
    };
    // The size is the kernel's: fstat where the file has one (a memfd; a dma-buf on recent
    // kernels), else a dma-buf's llseek(SEEK_END).
    struct stat st {};
    int64_t size = -1;
    if (::fstat(dmabuf.get(), &st) == 0 && st.st_size > 0) {
        size = st.st_size;
    } else {
        size = ::lseek(dmabuf.get(), 0, SEEK_END);
    }
    if (size <= 0) {
        const int err = errno;
        return refuse(Code::kInvalid, "the fd has no size: no dma-buf" +
                                          (size < 0 ? std::string(" (") + std::strerror(err) + ")"
                                                    : std::string()));
    }
    const uint64_t real = static_cast<uint64_t>(size);
    if (m.bytes == 0 || m.offset > real || m.bytes > real - m.offset) {
        return refuse(Code::kInvalid, "[" + std::to_string(m.offset) + ", +" +
                                          std::to_string(m.bytes) + ") runs past the end of the " +
                                          std::to_string(real) + "-byte dma-buf");
    }
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    if (m.alloc_bytes != 0 && ((m.alloc_bytes + page - 1) & ~(page - 1)) != real) {
        return refuse(Code::kInvalid, "the dma-buf holds " + std::to_string(real) +
                                          " bytes; the client says " +
                                          std::to_string(m.alloc_bytes));
    }
    if (Status q = lifecycle_.checkQuota(s, 0, false); !q.isOk()) {
        return refuse(q.code(), q.message());
    }
    RegionId id = 0;
    if (Status st2 = lifecycle_.addCudaDmabuf(
            s, m, std::make_shared<ipc::UniqueFd>(std::move(dmabuf)), real, &id);
        !st2.isOk()) {
        return refuse(st2.code(), st2.message());
    }
    reply_(s, m.h.seq, Code::kOk, id, m.bytes, "");
}

void CudaRegistrar::submitCheck(Session &s, const ipc::RegisterMsg &m,
                                std::shared_ptr<CudaImport> imp) {
    // The client's numbers are checked against the sidecar's own import of the allocation, on
    // the checker's thread (the import may take milliseconds); the reply waits for it.
    if (!checker_) {
        Status st;
        checker_ = CudaImportChecker::create(&st);
        if (!checker_) {
            reply_(s, m.h.seq, st.code(), 0, 0, "tl_register: " + st.message());
            return;
        }
        if (int rc = addToEpoll(epoll_fd_, checker_->fd(), EPOLLIN, kTagCudaCheck)) {
            checker_.reset();
            reply_(s, m.h.seq, Code::kInternal, 0, 0,
                   std::string("tl_register: epoll_ctl: ") + std::strerror(rc));
            return;
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
        if (!res.job.import->vmm()) {
            s->cuda_allocs[m.parent] = res.job.import;  // VMM registrations are never reused
        }
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
