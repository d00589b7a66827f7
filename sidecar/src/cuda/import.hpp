// What a client exported of one CUDA allocation, as the sidecar keeps it: the IPC handle (or,
// for VMM memory, its pieces' fds), the dma-buf fd of the whole allocation, its size and
// device, and the sidecar's own mapping of it,
// made on first use by a transport that needs CUDA access (local copies, tcp staging) and
// shared by every region registered in the allocation.
//
// Lifetime: regions hold it (Region::cuda.import), so it lives while any region of the
// allocation does, or a transfer that holds one. Its destructor hands the mapping to the
// runtime's release thread (cuIpcCloseMemHandle may take milliseconds; the last holder is often
// the engine thread) and closes the dma-buf fd: after a client deregisters its regions or dies,
// nothing of ours keeps its GPU memory alive.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda/runtime.hpp"
#include "cuda/vmm_piece.hpp"
#include "tensorlane/ipc/fd.hpp"

namespace tensorlane::sidecar {

class CudaImport {
public:
    /// `ordinal` is this sidecar's ordinal of the owner's device (CudaRuntime::ordinalOf);
    /// `alloc_bytes` is what the owner says its allocation holds, until verify() has checked it;
    /// `uid` the owner's (CudaRuntime::openIpc binds the import to it).
    CudaImport(const CudaIpcHandle &handle, int ordinal, uint64_t alloc_bytes,
               std::shared_ptr<ipc::UniqueFd> dmabuf, uint32_t uid);
    /// VMM memory: `pieces` (contiguous from 0, summing to `alloc_bytes`) are mapped by base()
    /// into a reservation of the sidecar's own, and their fds closed then. No uid binding: the
    /// fds are the capability, and only their holder could send them.
    /// `host`: the pieces are pinned host memory (ipc::kRegisterVmmHost), mapped for the
    /// sidecar's CPU; base() is then a CPU pointer.
    CudaImport(std::vector<VmmPieceFd> pieces, int ordinal, uint64_t alloc_bytes,
               uint64_t owner_address, std::shared_ptr<ipc::UniqueFd> dmabuf, bool host = false);
    ~CudaImport();
    CudaImport(const CudaImport &) = delete;
    CudaImport &operator=(const CudaImport &) = delete;

    /// The sidecar's device address of the allocation's first byte, importing it on first use.
    /// Transport threads only (it may take milliseconds); thread-safe.
    Status base(uint64_t *out);
    /// The device, as the sidecar numbers it.
    int ordinal() const { return ordinal_; }
    uint64_t allocBytes() const { return alloc_bytes_; }
    /// Whether this is VMM memory (its pieces mapped by the sidecar), not a CUDA IPC import.
    bool vmm() const { return vmm_; }
    /// Whether this is VMM host memory that base() maps for the CPU.
    bool host() const { return host_; }
    const CudaIpcHandle &handle() const { return handle_; }
    /// The owner's dma-buf fd of the whole allocation (empty when the owner could not take one).
    const std::shared_ptr<ipc::UniqueFd> &dmabuf() const { return dmabuf_; }
    /// Whether base() has mapped it (status, tests).
    bool imported() const;
    /// Imports the allocation (base()) and checks the owner's claim against the sidecar's own
    /// mapping: kInvalid when the allocation is smaller than `alloc_bytes`, kPermission when
    /// another uid's client imported the same handle. Once it succeeded, `alloc_bytes` bounds
    /// every region of the import for real. Transport-side threads only (it may take
    /// milliseconds: the CudaImportChecker's thread); thread-safe.
    Status verify();
    /// Whether verify() succeeded (any thread).
    bool verified() const { return verified_.load(std::memory_order_acquire); }

private:
    const CudaIpcHandle handle_;
    const int ordinal_;
    const uint64_t alloc_bytes_;
    const std::shared_ptr<ipc::UniqueFd> dmabuf_;
    const uint32_t uid_;
    const bool vmm_ = false;
    const bool host_ = false;
    std::atomic<bool> verified_{false};
    mutable std::mutex mu_;
    std::shared_ptr<CudaIpcMapping> mapping_;
    std::vector<VmmPieceFd> pieces_;     ///< VMM: until base() has mapped them
    std::shared_ptr<void> vmm_mapping_;  ///< VMM: the reservation, unmapped when dropped
    uint64_t vmm_base_ = 0;
    uint64_t owner_address_ = 0;  ///< VMM: the owner's address of the span (a mapping hint)
    Status failed_;  ///< a failed import is not retried (each try may cost milliseconds)
};

}  // namespace tensorlane::sidecar
