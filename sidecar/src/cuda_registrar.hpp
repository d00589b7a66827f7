// The registration handshake of CUDA memory (docs/gpu.md): a range of a client's
// cuMemAlloc/cudaMalloc allocation, with the allocation's IPC handle and dma-buf fd the first
// time, and only the allocation's key for every later range in it (no export; the import is
// shared); VMM memory, its pieces' fds staged by kVmmPieces messages before the registration;
// and dma-buf-only memory (tl_register_dmabuf), which the sidecar does not map. A first
// registration is verified on the import checker's thread before the client is answered; the region
// itself is made by the region lifecycle. The control server hands the kRegister messages of CUDA
// memory here. Engine thread only.
#pragma once

#include "spdlog_headers.hpp"  // first: fmt under its pragma

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cuda/vmm_piece.hpp"
#include "session_table.hpp"
#include "tensorlane/ipc/control.hpp"
#include "tensorlane/ipc/fd.hpp"
#include "tensorlane/sidecar/status.hpp"

namespace tensorlane::sidecar {

class CudaImport;
class CudaImportChecker;
class RegionLifecycle;

class CudaRegistrar {
public:
    /// Answers the client's call `seq` (the control server's reply()).
    using Reply = std::function<void(Session &s, uint64_t seq, Code status, uint64_t v0,
                                     uint64_t v1, const std::string &error)>;

    /// `epoll_fd`: the engine's, which gets the checker's fd (kTagCudaCheck) once the first
    /// registration needs it. The references must outlive this object.
    CudaRegistrar(int epoll_fd, SessionTable &sessions, RegionLifecycle &lifecycle, Reply reply);
    ~CudaRegistrar();
    CudaRegistrar(const CudaRegistrar &) = delete;
    CudaRegistrar &operator=(const CudaRegistrar &) = delete;

    /// A kRegister of CUDA memory, with the dma-buf fd it carried (if any). Answered now, or
    /// once the checker has verified a first import (finishChecks()).
    void registerCuda(Session &s, const ipc::RegisterMsg &m, ipc::UniqueFd dmabuf);
    /// A kVmmPieces message and its fds: staged in the session for the kRegisterVmm that
    /// follows (answered at once).
    void stagePieces(Session &s, const ipc::VmmPiecesMsg &m, ipc::UniqueFd *fds, size_t nfds);
    /// Answers the registrations whose imports the checker has verified (or refused).
    void finishChecks();

private:
    /// kRegisterVmm: the staged pieces become an import, verified by mapping them; `host`
    /// (kRegisterVmmHost): pinned host memory, mapped for the sidecar's CPU.
    void registerVmm(Session &s, const ipc::RegisterMsg &m, std::vector<VmmPieceFd> pieces,
                     ipc::UniqueFd dmabuf, bool host);
    /// kRegisterDmabufOnly: a region of a dma-buf the sidecar does not map.
    void registerDmabufOnly(Session &s, const ipc::RegisterMsg &m, ipc::UniqueFd dmabuf);
    /// Checks a dma-buf fd's size against a claimed allocation of `alloc_bytes` (kInvalid).
    static Status checkDmabufSize(int fd, uint64_t alloc_bytes);
    /// Hands a new import to the checker (created on first use); the reply waits for it.
    void submitCheck(Session &s, const ipc::RegisterMsg &m, std::shared_ptr<CudaImport> imp);

    /// The region of a registration whose import is verified; replies to the client.
    void addRegion(Session &s, const ipc::RegisterMsg &m, const std::shared_ptr<CudaImport> &imp);

    const int epoll_fd_;
    SessionTable &sessions_;
    RegionLifecycle &lifecycle_;
    Reply reply_;
    std::shared_ptr<spdlog::logger> log_;
    /// Verifies first registrations of CUDA allocations (made on the first one).
    std::unique_ptr<CudaImportChecker> checker_;
};

}  // namespace tensorlane::sidecar
