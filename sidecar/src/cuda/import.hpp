// What a client exported of one CUDA allocation, as the sidecar keeps it: the IPC handle, the
// dma-buf fd of the whole allocation, its size and device, and the sidecar's own mapping of it,
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

#include "cuda/runtime.hpp"
#include "tensorlane/ipc/fd.hpp"

namespace tensorlane::sidecar {

class CudaImport {
public:
    /// `ordinal` is this sidecar's ordinal of the owner's device (CudaRuntime::ordinalOf);
    /// `alloc_bytes` is what the owner says its allocation holds, until verify() has checked it;
    /// `uid` the owner's (CudaRuntime::openIpc binds the import to it).
    CudaImport(const CudaIpcHandle &handle, int ordinal, uint64_t alloc_bytes,
               std::shared_ptr<ipc::UniqueFd> dmabuf, uint32_t uid);
    ~CudaImport();
    CudaImport(const CudaImport &) = delete;
    CudaImport &operator=(const CudaImport &) = delete;

    /// The sidecar's device address of the allocation's first byte, importing it on first use.
    /// Transport threads only (it may take milliseconds); thread-safe.
    Status base(uint64_t *out);
    /// The device, as the sidecar numbers it.
    int ordinal() const { return ordinal_; }
    uint64_t allocBytes() const { return alloc_bytes_; }
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
    std::atomic<bool> verified_{false};
    mutable std::mutex mu_;
    std::shared_ptr<CudaIpcMapping> mapping_;
    Status failed_;  ///< a failed import is not retried (each try may cost milliseconds)
};

}  // namespace tensorlane::sidecar
