// What the kernel checks before a user MR exists, asked of the process itself: the simulator is a
// library in the process, not a driver, so it cannot pin pages; it refuses what pinning would
// refuse (drivers/infiniband/core/umem.c ib_umem_get, umem_dmabuf.c ib_umem_dmabuf_get).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

namespace tensorlane::simhca {

/// The host page size (PAGE_SIZE).
[[nodiscard]] uint64_t pageSize();

/// Pages [addr, addr + len) touches (ib_umem_num_pages); the caller has checked for overflow.
[[nodiscard]] uint64_t pagesSpanned(uint64_t addr, uint64_t len);

/// Whether [addr, addr + len) and its page-aligned end fit in the address space (ib_umem_get:
/// `addr + size < addr || PAGE_ALIGN(addr + size) < addr + size` is EINVAL).
[[nodiscard]] bool rangeFits(uint64_t addr, uint64_t len);

/// What pin_user_pages(FOLL_LONGTERM [| FOLL_WRITE]) would say of [addr, addr + len): 0, or
/// EFAULT when a page is not mapped, lacks read permission (or write permission when
/// `writable`), or cannot be faulted in (a file page past the end of its file, VM_IO/VM_PFNMAP
/// memory). `why` gets the reason. The mappings come from /proc/self/maps (its PROCMAP_QUERY
/// ioctl where the kernel has it, else its text), and one process_vm_readv(2) probe of the
/// last page of each mapping in the range asks the kernel's own page walk.
[[nodiscard]] int checkPinnable(uint64_t addr, uint64_t len, bool writable, std::string *why);

/// The process's mm->pinned_vm: pages pinned by its MRs, checked against RLIMIT_MEMLOCK unless
/// it has CAP_IPC_LOCK in the initial user namespace (capable(CAP_IPC_LOCK)).
class PinnedVm {
public:
    /// The process-wide count.
    static PinnedVm &instance();
    /// Charges `pages`: 0; EPERM when the limit is 0 and the process lacks CAP_IPC_LOCK
    /// (!can_do_mlock()); ENOMEM when the total would pass the limit and it lacks
    /// CAP_IPC_LOCK. `why` gets the reason.
    [[nodiscard]] int charge(uint64_t pages, std::string *why);
    /// Gives back pages charged by process `owner` (a forked child's count starts at zero,
    /// as its mm's does, and does not give back what its parent charged).
    void uncharge(pid_t owner, uint64_t pages);

private:
    std::mutex mu_;
    pid_t pid_ = 0;
    uint64_t pages_ = 0;
};

/// The size of the buffer behind a dma-buf fd, as the kernel sees dmabuf->size: st_size of a
/// regular file (a memfd standing in), else lseek(fd, 0, SEEK_END) (a dma-buf answers its
/// size and keeps its offset). 0 with *size, EBADF for no open fd, or ENODATA when the fd has
/// no size (a pipe, a socket).
[[nodiscard]] int dmabufSize(int fd, uint64_t *size);

}  // namespace tensorlane::simhca
