// CUDA memory for tl_register: what a device pointer belongs to, the export of its allocation
// (CUDA IPC handle + dma-buf fd), and the client's record of the allocations it has exported,
// so that a second tensor in one of them registers without a new export.
//
// VMM memory (cuMemCreate pieces mapped with cuMemMap) has no CUDA IPC handle: its pieces go
// as POSIX fds, and a dma-buf of their span beside them (exportVmmRange).
//
// The allocation is found with cuMemGetAddressRange (PyTorch's caching allocator hands out
// pieces of larger cudaMalloc blocks) and keyed by its CU_POINTER_ATTRIBUTE_BUFFER_ID, which
// the driver never gives to another allocation in this process: an allocation freed and another
// made at the same address is a new key, never a stale cache hit.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensorlane/ipc/control.hpp"
#include "tensorlane/ipc/fd.hpp"
#include "tensorlane/ipc/status.hpp"

namespace tensorlane::shim {

/// "0x7f00c0000000", for the texts of refusals.
std::string hexAddress(uint64_t a);

/// What a pointer is, as far as tl_register cares.
enum class CudaPointer {
    kNotCuda,  ///< no CUDA driver, CUDA not in use, or memory CUDA does not know
    kDevice,   ///< device memory of a cuMemAlloc/cudaMalloc allocation (info filled in)
    /// device memory mapped with the VMM calls (cuMemCreate + cuMemMap: PyTorch's expandable
    /// segments, NCCL's buffers); info filled in but base/bytes (exportVmmRange finds them)
    kVmm,
    /// pinned host memory mapped with the VMM calls (cuMemCreate at a host location with a
    /// POSIX-fd handle: NCCL's host buffers since 2.23); `context` filled in, no device
    kVmmHost,
    kRefused,  ///< memory CUDA knows but tl_register cannot take (managed, pinned host, ...)
};

/// A device pointer's allocation.
struct CudaAllocation {
    uint64_t buffer_id = 0;  ///< CU_POINTER_ATTRIBUTE_BUFFER_ID
    uint64_t base = 0;       ///< the allocation's first byte (cuMemGetAddressRange)
    uint64_t bytes = 0;      ///< its size
    int ordinal = -1;        ///< the device, as this process numbers it
    std::array<unsigned char, 16> uuid{};
    void *context = nullptr;  ///< the CUcontext it belongs to
};

/// Classifies `ptr`; for kDevice fills `*out`, for kRefused sets `*why`.
CudaPointer probeCudaPointer(const void *ptr, CudaAllocation *out, std::string *why);

/// What the owner exports of one allocation.
struct CudaExport {
    std::array<unsigned char, 64> ipc_handle{};
    ipc::UniqueFd dmabuf;      ///< the dma-buf fd of the whole allocation; empty: see dmabuf_error
    int32_t dmabuf_error = 0;  ///< CUresult of cuMemGetHandleForAddressRange when it failed
};

/// Exports the allocation: its CUDA IPC handle (required; kCuda with the reason when the
/// driver refuses, e.g. VMM memory from cuMemCreate) and a dma-buf fd of all of it (optional:
/// where the driver or kernel cannot, `dmabuf_error` says why and no fd goes).
ipc::Code exportCudaAllocation(const CudaAllocation &a, CudaExport *out, std::string *why);

/// The allocations this client has exported and that still have regions at the sidecar.
/// Not thread-safe: the client serialises CUDA registrations.
class CudaExports {
public:
    /// True when `buffer_id` was exported and still has a region.
    bool known(uint64_t buffer_id) const { return regions_.count(buffer_id) != 0; }
    /// One more region in the allocation.
    void addRegion(uint64_t buffer_id) { ++regions_[buffer_id]; }
    /// One region fewer; the record goes with the last (the sidecar lets go of the allocation
    /// then, so the next registration in it exports again).
    void dropRegion(uint64_t buffer_id) {
        auto it = regions_.find(buffer_id);
        if (it != regions_.end() && --it->second == 0) {
            regions_.erase(it);
        }
    }
    /// The sidecar no longer knows the allocation (kNotFound to a reuse): export it again.
    void forget(uint64_t buffer_id) { regions_.erase(buffer_id); }

private:
    std::unordered_map<uint64_t, uint32_t> regions_;
};

/// What the owner exports of VMM memory around a range: the span of the pieces (physical
/// allocations, each mapped whole) that cover it, each piece's POSIX fd, and a dma-buf of the
/// span. Without a shareable handle type on some piece (cuMemCreate with
/// requestedHandleTypes = 0) there are no fds: the dma-buf alone can carry the memory.
struct VmmExport {
    uint64_t base = 0;   ///< the span's first byte (the first piece's)
    uint64_t bytes = 0;  ///< the span's size (the pieces' sum)
    std::vector<ipc::VmmPiece> pieces;
    std::vector<ipc::UniqueFd> fds;  ///< one per piece; empty: `no_fd_reason` says why
    std::string no_fd_reason;
    ipc::UniqueFd dmabuf;      ///< of the whole span; empty: see dmabuf_error
    int32_t dmabuf_error = 0;  ///< CUresult of cuMemGetHandleForAddressRange when it failed
};

/// Exports the VMM pieces that cover [ptr, ptr + bytes) (at most ipc::kMaxVmmPieces).
/// kCuda with the reason when the range is not mapped memory, or when neither the pieces' fds
/// nor the span's dma-buf can be had.
ipc::Code exportVmmRange(const CudaAllocation &a, uint64_t ptr, uint64_t bytes, VmmExport *out,
                         std::string *why);

/// Pins a tl_alloc_host mapping for CUDA (cuMemHostRegister, portable to every context) when
/// this process uses CUDA; a no-op otherwise. True when it pinned.
bool pinHostForCuda(void *base, size_t bytes);
/// Undoes pinHostForCuda (before the mapping goes).
void unpinHostForCuda(void *base);

}  // namespace tensorlane::shim
