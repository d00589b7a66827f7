// Memory registration the kernel refuses, and the neighbours it accepts: ibv_reg_mr pins every
// page of the range (ib_umem_get: pin_user_pages with FOLL_WRITE when the access is writable,
// charged to the process's RLIMIT_MEMLOCK unless it has CAP_IPC_LOCK), the address and the iova
// share their page offset (ib_uverbs_reg_mr), and a dma-buf MR lies inside its buffer
// (ib_umem_dmabuf_get). The errnos are the kernel's, so the suite asks a real HCA the same.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <linux/udmabuf.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include "verbs_fixture.hpp"

namespace tensorlane::simhca::test {
namespace {

size_t pageSize() {
    return static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

constexpr int kWritable = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

/// A device and a PD of device A, for registrations without traffic.
class Pd {
public:
    Pd() {
        ctx_ = openDevice(config().dev_a);
        if (ctx_ != nullptr) {
            pd_ = ibv_alloc_pd(ctx_);
        }
    }
    ~Pd() {
        if (pd_ != nullptr) {
            ibv_dealloc_pd(pd_);
        }
        if (ctx_ != nullptr) {
            ibv_close_device(ctx_);
        }
    }
    Pd(const Pd &) = delete;
    Pd &operator=(const Pd &) = delete;
    ibv_pd *get() const { return pd_; }

private:
    ibv_context *ctx_ = nullptr;
    ibv_pd *pd_ = nullptr;
};

/// Registers and reports the errno (0: it worked; the MR is deregistered at once).
int regErrno(ibv_pd *pd, void *addr, size_t len, int access) {
    errno = 0;
    ibv_mr *mr = ibv_reg_mr(pd, addr, len, access);
    if (mr == nullptr) {
        return errno != 0 ? errno : -1;
    }
    ibv_dereg_mr(mr);
    return 0;
}

int dmabufErrno(ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova, int fd, int access) {
    errno = 0;
    ibv_mr *mr = ibv_reg_dmabuf_mr(pd, offset, len, iova, fd, access);
    if (mr == nullptr) {
        return errno != 0 ? errno : -1;
    }
    ibv_dereg_mr(mr);
    return 0;
}

/// Anonymous pages, unmapped on destruction.
struct Pages {
    explicit Pages(size_t n, int prot = PROT_READ | PROT_WRITE) : len(n * pageSize()) {
        void *m = mmap(nullptr, len, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        base = m == MAP_FAILED ? nullptr : static_cast<uint8_t *>(m);
    }
    ~Pages() {
        if (base != nullptr) {
            munmap(base, len);
        }
    }
    Pages(const Pages &) = delete;
    Pages &operator=(const Pages &) = delete;
    uint8_t *page(size_t i) const { return base + i * pageSize(); }
    uint8_t *base = nullptr;
    size_t len;
};

TEST(MrRegistration, AnUnmappedRangeIsEfault) {
    Pd pd;
    ASSERT_NE(pd.get(), nullptr);
    // Below mmap_min_addr (64 KiB) nothing is ever mapped.
    void *low = reinterpret_cast<void *>(0x2000);
    EXPECT_EQ(regErrno(pd.get(), low, pageSize(), IBV_ACCESS_LOCAL_WRITE), EFAULT);
    EXPECT_EQ(regErrno(pd.get(), low, pageSize(), 0), EFAULT);
    // A range whose last page was unmapped: the pin fails part-way, nothing is registered.
    Pages p(3);
    ASSERT_NE(p.base, nullptr);
    ASSERT_EQ(munmap(p.page(2), pageSize()), 0);
    p.len = 2 * pageSize();
    EXPECT_EQ(regErrno(pd.get(), p.base, 3 * pageSize(), IBV_ACCESS_LOCAL_WRITE), EFAULT);
    EXPECT_EQ(regErrno(pd.get(), p.page(1) + 100, pageSize(), 0), EFAULT)
        << "the range ends in the unmapped page";
    // What is mapped still registers.
    EXPECT_EQ(regErrno(pd.get(), p.base, 2 * pageSize(), kWritable), 0);
    EXPECT_EQ(regErrno(pd.get(), p.page(1) + 100, pageSize() - 100, kWritable), 0);
}

TEST(MrRegistration, WritableAccessOnAReadOnlyPageIsEfault) {
    Pd pd;
    ASSERT_NE(pd.get(), nullptr);
    Pages p(2);
    ASSERT_NE(p.base, nullptr);
    ASSERT_EQ(mprotect(p.page(1), pageSize(), PROT_READ), 0);
    const int writable[] = {IBV_ACCESS_LOCAL_WRITE, kWritable,
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ};
    for (int access : writable) {
        EXPECT_EQ(regErrno(pd.get(), p.base, 2 * pageSize(), access), EFAULT)
            << "access 0x" << std::hex << access;
        EXPECT_EQ(regErrno(pd.get(), p.page(1), 16, access), EFAULT);
    }
    // Read access alone pins a read-only page; the writable page next to it is fine either way.
    EXPECT_EQ(regErrno(pd.get(), p.base, 2 * pageSize(), 0), 0);
    EXPECT_EQ(regErrno(pd.get(), p.base, 2 * pageSize(), IBV_ACCESS_REMOTE_READ), 0);
    EXPECT_EQ(regErrno(pd.get(), p.base, pageSize(), kWritable), 0);
}

TEST(MrRegistration, AReadOnlyRegionServesRdmaReads) {
    QpPair pair;
    Pages p(1);
    ASSERT_NE(p.base, nullptr);
    std::memset(p.base, 0x5a, pageSize());
    ASSERT_EQ(mprotect(p.base, pageSize(), PROT_READ), 0);
    ibv_mr *mr = ibv_reg_mr(pair.b.pd, p.base, pageSize(), IBV_ACCESS_REMOTE_READ);
    ASSERT_NE(mr, nullptr) << strerror(errno);
    auto dst = pair.buffer(pair.a, pageSize());
    ASSERT_EQ(postSend(pair.a.qp, IBV_WR_RDMA_READ, *dst, 0, static_cast<uint32_t>(pageSize()),
                       reinterpret_cast<uint64_t>(p.base), mr->rkey, 1),
              0);
    ibv_wc wc{};
    ASSERT_TRUE(pollOne(pair.a.cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(dst->data()[0], 0x5a);
    EXPECT_EQ(dst->data()[pageSize() - 1], 0x5a);
    ibv_dereg_mr(mr);
}

TEST(MrRegistration, APageWithoutAccessIsEfault) {
    Pd pd;
    ASSERT_NE(pd.get(), nullptr);
    Pages p(2);
    ASSERT_NE(p.base, nullptr);
    ASSERT_EQ(mprotect(p.page(1), pageSize(), PROT_NONE), 0);
    EXPECT_EQ(regErrno(pd.get(), p.base, 2 * pageSize(), 0), EFAULT);
    EXPECT_EQ(regErrno(pd.get(), p.page(1), pageSize(), IBV_ACCESS_REMOTE_READ), EFAULT);
    EXPECT_EQ(regErrno(pd.get(), p.base, pageSize(), IBV_ACCESS_REMOTE_READ), 0);
}

TEST(MrRegistration, AMappedPagePastTheEndOfItsFileIsEfault) {
    Pd pd;
    ASSERT_NE(pd.get(), nullptr);
    const int fd = memfd_create("simhca-short", MFD_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, static_cast<off_t>(pageSize())), 0);
    // Two pages of a one-page file: the second cannot be faulted in (SIGBUS for a CPU access),
    // so the pin fails.
    void *m = mmap(nullptr, 2 * pageSize(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT_NE(m, MAP_FAILED);
    auto *base = static_cast<uint8_t *>(m);
    EXPECT_EQ(regErrno(pd.get(), base, 2 * pageSize(), kWritable), EFAULT);
    EXPECT_EQ(regErrno(pd.get(), base, 2 * pageSize(), 0), EFAULT);
    EXPECT_EQ(regErrno(pd.get(), base, pageSize(), kWritable), 0);
    munmap(m, 2 * pageSize());
    close(fd);
}

TEST(MrRegistration, TheIovaKeepsTheAddressPageOffset) {
    Pd pd;
    ASSERT_NE(pd.get(), nullptr);
    Pages p(1);
    ASSERT_NE(p.base, nullptr);
    errno = 0;
    EXPECT_EQ(ibv_reg_mr_iova(pd.get(), p.base + 16, 64, 0x10000000, IBV_ACCESS_LOCAL_WRITE),
              nullptr);
    EXPECT_EQ(errno, EINVAL);
    ibv_mr *mr = ibv_reg_mr_iova(pd.get(), p.base + 16, 64, 0x10000010, IBV_ACCESS_LOCAL_WRITE);
    ASSERT_NE(mr, nullptr) << strerror(errno);
    ibv_dereg_mr(mr);
    mr = ibv_reg_mr_iova2(pd.get(), p.base, 64, 0x7f0000000000ull, IBV_ACCESS_LOCAL_WRITE);
    ASSERT_NE(mr, nullptr) << strerror(errno);
    ibv_dereg_mr(mr);
}

/// A dma-buf of n bytes: a real one from /dev/udmabuf where the kernel has it, otherwise a
/// memfd standing in (the simulator only: a kernel refuses a memfd as a dma-buf).
struct Dmabuf {
    explicit Dmabuf(size_t n) {
        memfd = memfd_create("simhca-dmabuf", MFD_ALLOW_SEALING | MFD_CLOEXEC);
        if (memfd < 0 || ftruncate(memfd, static_cast<off_t>(n)) != 0) {
            return;
        }
        fd = memfd;
        const int dev = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
        if (dev >= 0) {
            fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK);
            udmabuf_create create{};
            create.memfd = static_cast<uint32_t>(memfd);
            create.size = n;
            const int dbuf = ioctl(dev, UDMABUF_CREATE, &create);
            if (dbuf >= 0) {
                fd = dbuf;
                real = true;
            }
            close(dev);
        }
    }
    ~Dmabuf() {
        if (fd >= 0 && fd != memfd) {
            close(fd);
        }
        if (memfd >= 0) {
            close(memfd);
        }
    }
    Dmabuf(const Dmabuf &) = delete;
    Dmabuf &operator=(const Dmabuf &) = delete;
    int memfd = -1;
    int fd = -1;
    bool real = false;
};

TEST(MrRegistration, ADmabufMrLongerThanItsBufferIsEinval) {
    const size_t n = 16 * pageSize();
    Dmabuf buf(n);
    ASSERT_GE(buf.fd, 0);
    if (!buf.real && !config().simulator) {
        GTEST_SKIP() << "no /dev/udmabuf: a memfd is no dma-buf to a kernel";
    }
    Pd pd;
    ASSERT_NE(pd.get(), nullptr);
    const uint64_t iova = 0x200000;
    const size_t page = pageSize();
    // offset + length past the buffer's size (lseek(fd, 0, SEEK_END) = dmabuf->size).
    EXPECT_EQ(dmabufErrno(pd.get(), 0, n + 1, iova, buf.fd, kWritable), EINVAL);
    EXPECT_EQ(dmabufErrno(pd.get(), page, n, iova, buf.fd, kWritable), EINVAL);
    EXPECT_EQ(dmabufErrno(pd.get(), n, 1, iova, buf.fd, IBV_ACCESS_LOCAL_WRITE), EINVAL);
    // offset + length wraps.
    EXPECT_EQ(
        dmabufErrno(pd.get(), ~static_cast<uint64_t>(page - 1), 2 * page, iova, buf.fd, kWritable),
        EINVAL);
    // The offset and the iova share their page offset, as for ibv_reg_mr.
    EXPECT_EQ(dmabufErrno(pd.get(), 0, page, iova + 16, buf.fd, kWritable), EINVAL);
    // Exactly the buffer, or a tail of it, registers.
    EXPECT_EQ(dmabufErrno(pd.get(), 0, n, iova, buf.fd, kWritable), 0);
    EXPECT_EQ(dmabufErrno(pd.get(), page, n - page, iova, buf.fd, kWritable), 0);
    EXPECT_EQ(dmabufErrno(pd.get(), page + 16, n - page - 16, iova + 16, buf.fd, kWritable), 0);
}

TEST(MrRegistration, ADmabufMrOnABadFdIsEbadf) {
    Pd pd;
    ASSERT_NE(pd.get(), nullptr);
    EXPECT_EQ(dmabufErrno(pd.get(), 0, pageSize(), 0x200000, -1, kWritable), EBADF);
    const int fd = memfd_create("simhca-closed", MFD_CLOEXEC);
    ASSERT_GE(fd, 0);
    close(fd);
    EXPECT_EQ(dmabufErrno(pd.get(), 0, pageSize(), 0x200000, fd, kWritable), EBADF);
}

// ---- RLIMIT_MEMLOCK: a process of its own (a death-test child, a fresh exec of this binary)
// opens the device as root, sets its limit, then gives up what lets it pin past the limit.

enum class Privilege {
    kNobody,              ///< setresuid to 65534: every capability goes
    kRootWithoutIpcLock,  ///< still uid 0, CAP_IPC_LOCK dropped from its sets
    kRoot,                ///< uid 0 with CAP_IPC_LOCK
};

bool hasCapability(unsigned cap) {
    __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[2]{};
    return syscall(SYS_capget, &hdr, data) == 0 &&
           (data[cap / 32].effective & (1u << (cap % 32))) != 0;
}

bool dropIpcLock() {
    __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[2]{};
    if (syscall(SYS_capget, &hdr, data) != 0) {
        return false;
    }
    const unsigned bit = 1u << (CAP_IPC_LOCK % 32);
    data[CAP_IPC_LOCK / 32].effective &= ~bit;
    data[CAP_IPC_LOCK / 32].permitted &= ~bit;
    data[CAP_IPC_LOCK / 32].inheritable &= ~bit;
    return syscall(SYS_capset, &hdr, data) == 0;
}

[[noreturn]] void fail(const std::string &why) {
    std::fprintf(stderr, "child: %s\n", why.c_str());
    std::fflush(stderr);
    _exit(1);
}

/// Runs body(pd) as `who` with RLIMIT_MEMLOCK = limit bytes; exits 0 when body returns "",
/// else 1 with body's complaint on stderr (the death-test matcher shows it).
[[noreturn]] void runAs(Privilege who, rlim_t limit,
                        const std::function<std::string(ibv_pd *)> &body) {
    Pd pd;
    if (pd.get() == nullptr) {
        fail("cannot open " + config().dev_a);
    }
    const rlimit rl{limit, limit};
    if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) {
        fail(std::string("setrlimit: ") + strerror(errno));
    }
    if (who == Privilege::kNobody &&
        (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 ||
         setresuid(65534, 65534, 65534) != 0)) {
        fail(std::string("cannot become uid 65534: ") + strerror(errno));
    }
    if (who == Privilege::kRootWithoutIpcLock && !dropIpcLock()) {
        fail(std::string("cannot drop CAP_IPC_LOCK: ") + strerror(errno));
    }
    const std::string why = body(pd.get());
    if (!why.empty()) {
        fail(why);
    }
    std::fflush(stderr);
    _exit(0);
}

std::string expectErrno(ibv_pd *pd, void *addr, size_t len, int access, int want,
                        const char *what) {
    const int got = regErrno(pd, addr, len, access);
    if (got == want) {
        return "";
    }
    return std::string(what) + ": got " + (got == 0 ? "success" : strerror(got)) + ", want " +
           (want == 0 ? "success" : strerror(want));
}

// The child is a fresh exec of this binary ("threadsafe": no thread of this process, such as
// the simulator's engine, comes along).
#define SKIP_UNLESS_ROOT()                                                          \
    GTEST_FLAG_SET(death_test_style, "threadsafe");                                 \
    if (geteuid() != 0) {                                                           \
        GTEST_SKIP() << "needs root, to become an unprivileged process in a child"; \
    }

TEST(MrMemlock, AnUnprivilegedProcessPinsUpToItsLimit) {
    SKIP_UNLESS_ROOT();
    EXPECT_EXIT(
        runAs(Privilege::kNobody, 16 * pageSize(),
              [](ibv_pd *pd) -> std::string {
                  const size_t page = pageSize();
                  Pages p(32);
                  if (p.base == nullptr) {
                      return "mmap failed";
                  }
                  // 12 + 4 pages: exactly the limit.
                  ibv_mr *a = ibv_reg_mr(pd, p.base, 12 * page, kWritable);
                  ibv_mr *b = ibv_reg_mr(pd, p.page(12), 4 * page, 0);
                  if (a == nullptr || b == nullptr) {
                      return std::string("16 pages within a 16-page limit: ") + strerror(errno);
                  }
                  // One page more, even read-only or registered again, is over it.
                  if (std::string e = expectErrno(pd, p.page(16), page, 0, ENOMEM, "the 17th page");
                      !e.empty()) {
                      return e;
                  }
                  if (std::string e =
                          expectErrno(pd, p.base, page, kWritable, ENOMEM, "a page twice");
                      !e.empty()) {
                      return e;
                  }
                  // Deregistering gives the pages back; partial pages count whole.
                  ibv_dereg_mr(b);
                  if (std::string e = expectErrno(pd, p.page(16) + 1, 4 * page, kWritable, ENOMEM,
                                                  "4 pages + 1 byte spanning 5 pages");
                      !e.empty()) {
                      return e;
                  }
                  if (std::string e = expectErrno(pd, p.page(16) + 1, 4 * page - 1, kWritable, 0,
                                                  "4 pages less 1 byte, back within the limit");
                      !e.empty()) {
                      return e;
                  }
                  ibv_dereg_mr(a);
                  return expectErrno(pd, p.base, 16 * page, kWritable, 0, "all 16 again");
              }),
        ::testing::ExitedWithCode(0), "");
}

TEST(MrMemlock, AZeroLimitIsEperm) {
    SKIP_UNLESS_ROOT();
    // ib_umem_get: !can_do_mlock() (no limit and no CAP_IPC_LOCK) is EPERM, before counting.
    EXPECT_EXIT(runAs(Privilege::kNobody, 0,
                      [](ibv_pd *pd) {
                          Pages p(1);
                          return expectErrno(pd, p.base, 64, kWritable, EPERM, "a zero limit");
                      }),
                ::testing::ExitedWithCode(0), "");
}

TEST(MrMemlock, WithoutCapIpcLockRootIsLimitedToo) {
    SKIP_UNLESS_ROOT();
    EXPECT_EXIT(runAs(Privilege::kRootWithoutIpcLock, 16 * pageSize(),
                      [](ibv_pd *pd) {
                          Pages p(17);
                          return expectErrno(pd, p.base, 17 * pageSize(), kWritable, ENOMEM,
                                             "root without CAP_IPC_LOCK, 17 pages");
                      }),
                ::testing::ExitedWithCode(0), "");
}

constexpr size_t kBigMr = 16 << 20;  // twice Debian's default 8 MiB limit

TEST(MrMemlock, CapIpcLockPinsPastTheLimit) {
    SKIP_UNLESS_ROOT();
    EXPECT_EXIT(runAs(Privilege::kRoot, 16 * pageSize(),
                      [](ibv_pd *pd) {
                          Pages p(kBigMr / pageSize());
                          return expectErrno(pd, p.base, kBigMr, kWritable, 0,
                                             "CAP_IPC_LOCK, 16 MiB over a 64 KiB limit");
                      }),
                ::testing::ExitedWithCode(0), "");
}

TEST(MrMemlock, AnInfiniteLimitPinsAnything) {
    SKIP_UNLESS_ROOT();
    rlimit rl{};
    ASSERT_EQ(getrlimit(RLIMIT_MEMLOCK, &rl), 0);
    if (rl.rlim_max != RLIM_INFINITY && !hasCapability(CAP_SYS_RESOURCE)) {
        GTEST_SKIP() << "the hard RLIMIT_MEMLOCK is " << rl.rlim_max
                     << " bytes and raising it needs CAP_SYS_RESOURCE";
    }
    EXPECT_EXIT(runAs(Privilege::kNobody, RLIM_INFINITY,
                      [](ibv_pd *pd) {
                          Pages p(kBigMr / pageSize());
                          return expectErrno(pd, p.base, kBigMr, kWritable, 0,
                                             "uid 65534, RLIM_INFINITY, 16 MiB");
                      }),
                ::testing::ExitedWithCode(0), "");
}

TEST(MrMemlock, DmabufMrsAreNotChargedToTheLimit) {
    SKIP_UNLESS_ROOT();
    if (!config().simulator && access("/dev/udmabuf", R_OK | W_OK) != 0) {
        GTEST_SKIP() << "no /dev/udmabuf: a memfd is no dma-buf to a kernel";
    }
    // ib_umem_dmabuf_get pins nothing of the process: the exporter owns the pages.
    EXPECT_EXIT(runAs(Privilege::kNobody, 16 * pageSize(),
                      [](ibv_pd *pd) -> std::string {
                          const size_t n = 64 * pageSize();
                          Dmabuf buf(n);
                          if (buf.fd < 0) {
                              return "no dma-buf";
                          }
                          const int rc = dmabufErrno(pd, 0, n, 0x400000, buf.fd, kWritable);
                          return rc == 0 ? "" : std::string("64-page dma-buf: ") + strerror(rc);
                      }),
                ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace tensorlane::simhca::test
