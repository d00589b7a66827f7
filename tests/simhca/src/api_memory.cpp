// Exported verbs: protection domains and memory registration (ibv_alloc_pd(3), ibv_reg_mr(3)
// including ibv_reg_mr_iova2 and ibv_reg_dmabuf_mr).
#include <infiniband/verbs.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "cuda_driver.hpp"
#include "log.hpp"
#include "memory_region.hpp"
#include "mr_table.hpp"
#include "pd.hpp"
#include "umem.hpp"
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

// ib_access_writable(): the pin asks for write access (FOLL_WRITE) with any of these.
constexpr unsigned kWritableAccess =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;

ibv_mr *refuse(int err) {
    errno = err;
    return nullptr;
}

// ib_check_mr_access() and a zero length (ib_umem_num_pages() == 0): EINVAL.
bool accessOk(unsigned access, size_t length) {
    return (access & ~kSupportedAccess) == 0 && length != 0 &&
           (!(access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) ||
            (access & IBV_ACCESS_LOCAL_WRITE));
}

// ib_uverbs_reg_mr() and UVERBS_METHOD_REG_DMABUF_MR: the HCA translates by page, so the
// address (or dma-buf offset) and the iova must sit at the same offset in their pages.
bool samePageOffset(uint64_t a, uint64_t iova) {
    return (a & (pageSize() - 1)) == (iova & (pageSize() - 1));
}

ibv_mr *registerRegion(ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned access,
                       MemoryKind kind, void *cuda_ctx) {
    const uint32_t key = MrTable::instance().reserve();
    auto *mr =
        new MemoryRegion(pd, addr, length, iova, static_cast<int>(access), kind, cuda_ctx, key);
    MrTable::instance().install(mr);
    return mr->ibv();
}

// ibv_reg_mr and friends: what the kernel checks in ib_uverbs_reg_mr() and ib_umem_get(), in
// its order. A pointer may be CUDA device memory (what nvidia-peermem lets a real HCA pin):
// the simulator then reaches it through the CUDA driver, and neither pins nor charges it.
ibv_mr *registerPointer(ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned access) {
    const auto a = reinterpret_cast<uint64_t>(addr);
    if (!samePageOffset(a, iova)) {
        log(LogLevel::kError,
            "ibv_reg_mr: address 0x%llx and iova 0x%llx lie at different offsets in their "
            "pages: EINVAL",
            static_cast<unsigned long long>(a), static_cast<unsigned long long>(iova));
        return refuse(EINVAL);
    }
    if (!accessOk(access, length) || !rangeFits(a, length)) {
        return refuse(EINVAL);
    }
    void *cuda_ctx = nullptr;
    if (CudaDriver::instance().isDevicePointer(a, &cuda_ctx)) {
        return registerRegion(pd, addr, length, iova, access, MemoryKind::kCuda, cuda_ctx);
    }
    const uint64_t pages = pagesSpanned(a, length);
    std::string why;
    if (int err = PinnedVm::instance().charge(pages, &why); err != 0) {
        log(LogLevel::kError, "ibv_reg_mr: [0x%llx, +%zu): %s: %s",
            static_cast<unsigned long long>(a), length, why.c_str(), strerror(err));
        return refuse(err);
    }
    if (int err = checkPinnable(a, length, (access & kWritableAccess) != 0, &why); err != 0) {
        PinnedVm::instance().uncharge(getpid(), pages);
        log(LogLevel::kError, "ibv_reg_mr: [0x%llx, +%zu): %s: %s",
            static_cast<unsigned long long>(a), length, why.c_str(), strerror(err));
        return refuse(err);
    }
    ibv_mr *mr = registerRegion(pd, addr, length, iova, access, MemoryKind::kHost, nullptr);
    MemoryRegion::from(mr)->ownPinnedPages(getpid(), pages);
    return mr;
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
// (udmabuf, memfd-backed buffers, dma-heaps); (3) otherwise EOPNOTSUPP, said on stderr (at
// once for an fd without a size, as a kernel without dma-buf MRs answers first). Then it
// checks what the kernel checks (UVERBS_METHOD_REG_DMABUF_MR, ib_umem_dmabuf_get()): the
// offset's page offset is the iova's, the fd is open, offset + length neither wraps nor
// passes the buffer's size (dmabuf->size; a memfd stand-in's file size). Nothing is charged
// to RLIMIT_MEMLOCK: the exporter owns the pages.
ibv_mr *ibv_reg_dmabuf_mr(ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                          int access) {
    const auto acc = static_cast<unsigned>(access);
    uint64_t size = 0;
    const int size_err = dmabufSize(fd, &size);
    void *cuda_ctx = nullptr;
    const bool cuda = CudaDriver::instance().isDevicePointer(iova, &cuda_ctx);
    if (size_err == ENODATA && !cuda) {
        // Nothing the simulator can reach (a pipe, a socket): it answers as a host without
        // dma-buf MRs, whose kernel says EOPNOTSUPP before it looks at anything else
        // (UVERBS_METHOD_REG_DMABUF_MR without ops.reg_user_mr_dmabuf).
        log(LogLevel::kError,
            "ibv_reg_dmabuf_mr: fd %d has no size, so cannot be mapped, and iova 0x%llx is not "
            "CUDA memory of this process: EOPNOTSUPP",
            fd, static_cast<unsigned long long>(iova));
        return refuse(EOPNOTSUPP);
    }
    uint64_t end = 0;
    if (!samePageOffset(offset, iova)) {
        log(LogLevel::kError,
            "ibv_reg_dmabuf_mr: offset 0x%llx and iova 0x%llx lie at different offsets in "
            "their pages: EINVAL",
            static_cast<unsigned long long>(offset), static_cast<unsigned long long>(iova));
        return refuse(EINVAL);
    }
    if (!accessOk(acc, length) || __builtin_add_overflow(offset, length, &end)) {
        return refuse(EINVAL);
    }
    if (size_err == EBADF) {
        return refuse(EBADF);  // dma_buf_get(): fget() fails
    }
    if (size_err == 0 && end > size) {
        log(LogLevel::kError,
            "ibv_reg_dmabuf_mr: offset %llu + length %zu passes the %llu bytes of fd %d: "
            "EINVAL",
            static_cast<unsigned long long>(offset), length, static_cast<unsigned long long>(size),
            fd);
        return refuse(EINVAL);
    }
    if (cuda) {
        if (size_err != 0) {
            // A CUDA dma-buf answers lseek(SEEK_END) with its size; this fd is no dma-buf.
            log(LogLevel::kError, "ibv_reg_dmabuf_mr: fd %d has no size, so is no dma-buf: EINVAL",
                fd);
            return refuse(EINVAL);
        }
        return registerRegion(pd, reinterpret_cast<void *>(iova), length, iova, acc,
                              MemoryKind::kCuda, cuda_ctx);
    }
    const uint64_t base = offset & ~(pageSize() - 1);
    const size_t map_len = length + (offset - base);
    void *m =
        mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(base));
    if (m == MAP_FAILED) {
        const int err = errno;
        log(LogLevel::kError,
            "ibv_reg_dmabuf_mr: fd %d cannot be mapped (%s) and iova 0x%llx is not CUDA memory "
            "of this process",
            fd, strerror(err), static_cast<unsigned long long>(iova));
        return refuse(EOPNOTSUPP);
    }
    ibv_mr *mr = registerRegion(pd, static_cast<uint8_t *>(m) + (offset - base), length, iova, acc,
                                MemoryKind::kHost, nullptr);
    MemoryRegion::from(mr)->ownMapping(m, map_len);
    return mr;
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
