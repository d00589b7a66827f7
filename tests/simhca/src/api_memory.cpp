// Exported verbs: protection domains and memory registration (ibv_alloc_pd(3), ibv_reg_mr(3)
// including ibv_reg_mr_iova2 and ibv_reg_dmabuf_mr).
#include <infiniband/verbs.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "cuda_driver.hpp"
#include "log.hpp"
#include "memory_region.hpp"
#include "mr_table.hpp"
#include "pd.hpp"
#include "verbs_ops.hpp"

#undef ibv_reg_mr
#undef ibv_reg_mr_iova

using namespace tensorlane::simhca;

namespace {

// Access flags a region may carry (ibv_reg_mr(3)); remote write and atomic need local write
// (IB spec 10.6.3.1 / C10-..., as rdma-core's ibv_reg_mr checks in the kernel: EINVAL).
constexpr unsigned kSupportedAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                      IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                                      IBV_ACCESS_RELAXED_ORDERING | IBV_ACCESS_OPTIONAL_RANGE;

ibv_mr *registerRegion(ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned access,
                       MemoryKind kind, void *cuda_ctx, void *map_base, size_t map_len) {
    if ((access & ~kSupportedAccess) != 0 || length == 0 ||
        ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
         !(access & IBV_ACCESS_LOCAL_WRITE))) {
        if (map_base != nullptr) {
            munmap(map_base, map_len);
        }
        errno = EINVAL;
        return nullptr;
    }
    const uint32_t key = MrTable::instance().reserve();
    auto *mr =
        new MemoryRegion(pd, addr, length, iova, static_cast<int>(access), kind, cuda_ctx, key);
    if (map_base != nullptr) {
        mr->ownMapping(map_base, map_len);
    }
    MrTable::instance().install(mr);
    return mr->ibv();
}

// A pointer registered with ibv_reg_mr may be CUDA device memory (what nvidia-peermem lets a
// real HCA pin): the simulator then reaches it through the CUDA driver.
ibv_mr *registerPointer(ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned access) {
    void *cuda_ctx = nullptr;
    const bool device =
        CudaDriver::instance().isDevicePointer(reinterpret_cast<uint64_t>(addr), &cuda_ctx);
    return registerRegion(pd, addr, length, iova, access,
                          device ? MemoryKind::kCuda : MemoryKind::kHost, cuda_ctx, nullptr, 0);
}

}  // namespace

extern "C" {

ibv_pd *ibv_alloc_pd(ibv_context *context) {
    return (new SimPd(context))->ibv();
}

int ibv_dealloc_pd(ibv_pd *pd) {
    delete SimPd::from(pd);
    return 0;
}

ibv_mr *ibv_reg_mr(ibv_pd *pd, void *addr, size_t length, int access) {
    return registerPointer(pd, addr, length, reinterpret_cast<uint64_t>(addr),
                           static_cast<unsigned>(access));
}

ibv_mr *ibv_reg_mr_iova(ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access) {
    return registerPointer(pd, addr, length, iova, static_cast<unsigned>(access));
}

ibv_mr *ibv_reg_mr_iova2(ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                         unsigned int access) {
    return registerPointer(pd, addr, length, iova, access);
}

// The HCA reaches a dma-buf through the exporter. The simulator is not a device driver, so it
// uses what a process can: (1) when iova is a CUDA device address in this process (NCCL and
// the sidecar pass the allocation's device pointer as iova), it copies through the CUDA
// driver; (2) otherwise it mmap(2)s the fd at offset, which works for exporters that allow it
// (udmabuf, memfd-backed buffers, dma-heaps); (3) otherwise EOPNOTSUPP, said on stderr.
ibv_mr *ibv_reg_dmabuf_mr(ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                          int access) {
    void *cuda_ctx = nullptr;
    if (CudaDriver::instance().isDevicePointer(iova, &cuda_ctx)) {
        return registerRegion(pd, reinterpret_cast<void *>(iova), length, iova,
                              static_cast<unsigned>(access), MemoryKind::kCuda, cuda_ctx, nullptr,
                              0);
    }
    const long page = sysconf(_SC_PAGESIZE);
    const uint64_t base = offset & ~static_cast<uint64_t>(page - 1);
    const size_t map_len = length + (offset - base);
    void *m =
        mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(base));
    if (m == MAP_FAILED) {
        const int err = errno;
        log(LogLevel::kError,
            "ibv_reg_dmabuf_mr: fd %d cannot be mapped (%s) and iova 0x%llx is not CUDA memory "
            "of this process",
            fd, strerror(err), static_cast<unsigned long long>(iova));
        errno = EOPNOTSUPP;
        return nullptr;
    }
    return registerRegion(pd, static_cast<uint8_t *>(m) + (offset - base), length, iova,
                          static_cast<unsigned>(access), MemoryKind::kHost, nullptr, m, map_len);
}

int ibv_rereg_mr(ibv_mr *, int, ibv_pd *, void *, size_t, int) {
    return IBV_REREG_MR_ERR_INPUT;  // not modelled: deregister and register again
}

int ibv_dereg_mr(ibv_mr *mr) {
    MemoryRegion *m = MemoryRegion::from(mr);
    MrTable::instance().remove(m);  // waits for packets using it
    delete m;
    return 0;
}

ibv_pd *ibv_import_pd(ibv_context *, uint32_t) {
    errno = EOPNOTSUPP;
    return nullptr;
}

void ibv_unimport_pd(ibv_pd *) {}

ibv_mr *ibv_import_mr(ibv_pd *, uint32_t) {
    errno = EOPNOTSUPP;
    return nullptr;
}

void ibv_unimport_mr(ibv_mr *) {}

ibv_dm *ibv_import_dm(ibv_context *, uint32_t) {
    errno = EOPNOTSUPP;
    return nullptr;
}

void ibv_unimport_dm(ibv_dm *) {}

}  // extern "C"

namespace tensorlane::simhca::ops {

ibv_mw *allocMw(ibv_pd *, ibv_mw_type) {
    errno = EOPNOTSUPP;  // memory windows are not modelled
    return nullptr;
}

int bindMw(ibv_qp *, ibv_mw *, ibv_mw_bind *) {
    return EOPNOTSUPP;
}

int deallocMw(ibv_mw *) {
    return EOPNOTSUPP;
}

}  // namespace tensorlane::simhca::ops
