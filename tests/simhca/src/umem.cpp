#include "umem.hpp"

#include <fcntl.h>
#include <linux/capability.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "log.hpp"

namespace tensorlane::simhca {
namespace {

std::string hex(uint64_t v) {
    char b[24];
    std::snprintf(b, sizeof b, "0x%" PRIx64, v);
    return b;
}

/// One line of /proc/self/maps.
struct Vma {
    uint64_t start = 0;
    uint64_t end = 0;
    bool read = false;
    bool write = false;
};

// PROCMAP_QUERY (Linux 6.11, include/uapi/linux/fs.h): one mapping of /proc/PID/maps by
// ioctl, without formatting the whole file. Declared here: the build's headers may predate it.
struct ProcmapQuery {
    uint64_t size;
    uint64_t query_flags;
    uint64_t query_addr;
    uint64_t vma_start;
    uint64_t vma_end;
    uint64_t vma_flags;
    uint64_t vma_page_size;
    uint64_t vma_offset;
    uint64_t inode;
    uint32_t dev_major;
    uint32_t dev_minor;
    uint32_t vma_name_size;
    uint32_t build_id_size;
    uint64_t vma_name_addr;
    uint64_t build_id_addr;
};
static_assert(sizeof(ProcmapQuery) == 104, "struct procmap_query of Linux 6.11");
constexpr unsigned long kProcmapQuery = _IOWR('f', 17, ProcmapQuery);
constexpr uint64_t kQueryReadable = 0x01;
constexpr uint64_t kQueryWritable = 0x02;
constexpr uint64_t kQueryCoveringOrNext = 0x10;

// Off once the kernel answers PROCMAP_QUERY with ENOTTY (before 6.11), or from the start with
// TENSORLANE_SIMHCA_PROCMAP_QUERY=0 (so the tests cover the text too): the text is read.
bool queryWanted() {
    const char *v = std::getenv("TENSORLANE_SIMHCA_PROCMAP_QUERY");
    return v == nullptr || std::strcmp(v, "0") != 0;
}
std::atomic<bool> g_query_ok{queryWanted()};

/// Walks the mappings of /proc/self/maps in address order: by PROCMAP_QUERY, else its lines.
class MapsReader {
public:
    explicit MapsReader(int fd) : fd_(fd) {}
    ~MapsReader() {
        if (fd_ >= 0) {
            ::close(fd_);
        }
    }
    MapsReader(const MapsReader &) = delete;
    MapsReader &operator=(const MapsReader &) = delete;
    /// The first mapping that ends above addr; false at the end (or on an error).
    bool next(uint64_t addr, Vma *v) {
        if (g_query_ok.load(std::memory_order_relaxed)) {
            ProcmapQuery q{};
            q.size = sizeof q;
            q.query_flags = kQueryCoveringOrNext;
            q.query_addr = addr;
            if (::ioctl(fd_, kProcmapQuery, &q) == 0) {
                v->start = q.vma_start;
                v->end = q.vma_end;
                v->read = (q.vma_flags & kQueryReadable) != 0;
                v->write = (q.vma_flags & kQueryWritable) != 0;
                return true;
            }
            if (errno != ENOTTY && errno != EINVAL) {
                return false;  // ENOENT: no mapping at or above addr
            }
            g_query_ok.store(false, std::memory_order_relaxed);
        }
        while (nextLine(v)) {
            if (v->end > addr) {
                return true;
            }
        }
        return false;
    }

private:
    bool nextLine(Vma *v) {
        for (;;) {
            char *nl = static_cast<char *>(std::memchr(buf_ + pos_, '\n', len_ - pos_));
            if (nl != nullptr) {
                *nl = '\0';
                const char *line = buf_ + pos_;
                pos_ = static_cast<size_t>(nl - buf_) + 1;
                if (parse(line, v)) {
                    return true;
                }
                continue;
            }
            // Keep the partial line, read more behind it.
            std::memmove(buf_, buf_ + pos_, len_ - pos_);
            len_ -= pos_;
            pos_ = 0;
            if (len_ == sizeof buf_) {
                len_ = 0;  // a line longer than the buffer (a path): cannot happen in practice
            }
            const ssize_t n = ::read(fd_, buf_ + len_, sizeof buf_ - len_);
            if (n <= 0) {
                return false;
            }
            len_ += static_cast<size_t>(n);
        }
    }

    // "start-end perms offset major:minor inode [path]" (proc_pid_maps(5)).
    static bool parse(const char *line, Vma *v) {
        char *p = nullptr;
        v->start = std::strtoull(line, &p, 16);
        if (*p != '-') {
            return false;
        }
        v->end = std::strtoull(p + 1, &p, 16);
        if (*p != ' ' || std::strlen(p) < 5) {
            return false;
        }
        v->read = p[1] == 'r';
        v->write = p[2] == 'w';
        return true;
    }

    int fd_;
    char buf_[8192];
    size_t pos_ = 0;
    size_t len_ = 0;
};

// Off where process_vm_readv(2) is not allowed (a seccomp profile); the maps still decide.
std::atomic<bool> g_probe_ok{true};

/// Whether the page at addr can be faulted in for reading: the kernel's own GUP walk (the one
/// pin_user_pages makes) answers EFAULT for a file page past EOF and for VM_IO/VM_PFNMAP
/// mappings ([vvar], device memory).
bool faultsIn(uint64_t addr) {
    if (!g_probe_ok.load(std::memory_order_relaxed)) {
        return true;
    }
    unsigned char byte = 0;
    iovec local{&byte, 1};
    iovec remote{reinterpret_cast<void *>(addr), 1};
    if (::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) == 1) {
        return true;
    }
    if (errno == EFAULT) {
        return false;
    }
    log(LogLevel::kInfo, "process_vm_readv on itself: %s; pages are not probed",
        std::strerror(errno));
    g_probe_ok.store(false, std::memory_order_relaxed);
    return true;
}

/// capable(CAP_IPC_LOCK): the effective set holds it and the process is in the initial user
/// namespace (a capability of a nested namespace does not lift the kernel's limit).
bool hasIpcLock() {
    __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3]{};
    if (::syscall(SYS_capget, &hdr, data) != 0 ||
        (data[CAP_IPC_LOCK / 32].effective & (1u << (CAP_IPC_LOCK % 32))) == 0) {
        return false;
    }
    // The initial namespace maps every uid to itself: "0 0 4294967295" (user_namespaces(7)).
    FILE *f = std::fopen("/proc/self/uid_map", "re");
    if (f == nullptr) {
        return true;  // no procfs: take the capability at its word
    }
    unsigned long long inner = 1, outer = 1, count = 0;
    const int n = std::fscanf(f, "%llu %llu %llu", &inner, &outer, &count);
    std::fclose(f);
    return n == 3 && inner == 0 && outer == 0 && count == 4294967295ull;
}

}  // namespace

uint64_t pageSize() {
    static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    return page;
}

uint64_t pagesSpanned(uint64_t addr, uint64_t len) {
    const uint64_t page = pageSize();
    const uint64_t first = addr & ~(page - 1);
    const uint64_t end = (addr + len + page - 1) & ~(page - 1);
    return (end - first) / page;
}

bool rangeFits(uint64_t addr, uint64_t len) {
    uint64_t end = 0;
    if (__builtin_add_overflow(addr, len, &end)) {
        return false;
    }
    uint64_t aligned = 0;
    return !__builtin_add_overflow(end, pageSize() - 1, &aligned);
}

int checkPinnable(uint64_t addr, uint64_t len, bool writable, std::string *why) {
    const uint64_t page = pageSize();
    uint64_t cur = addr & ~(page - 1);
    const uint64_t end = (addr + len + page - 1) & ~(page - 1);
    const int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        static std::atomic<bool> said{false};
        if (!said.exchange(true)) {
            log(LogLevel::kInfo,
                "no /proc/self/maps (%s): registrations are not checked against the process's "
                "mappings",
                std::strerror(errno));
        }
        return 0;
    }
    MapsReader maps(fd);
    Vma v;
    while (cur < end && maps.next(cur, &v)) {
        if (v.start > cur) {
            break;  // a hole at cur
        }
        if (writable ? !v.write : !v.read) {
            *why = "page " + hex(cur) + " is mapped without " +
                   (writable ? std::string("write permission and the access is writable "
                                           "(IBV_ACCESS_LOCAL_WRITE/REMOTE_WRITE/REMOTE_ATOMIC)")
                             : std::string("read permission"));
            return EFAULT;
        }
        const uint64_t stop = v.end < end ? v.end : end;
        // A file mapping may reach past its file (pages past EOF cannot be faulted in) or be
        // device memory: the last page of the part in range tells (file offsets grow with it;
        // for anonymous memory the probe finds the zero page).
        if (!faultsIn(stop - page)) {
            *why = "page " + hex(stop - page) +
                   " cannot be faulted in (past the end of its file, or device memory)";
            return EFAULT;
        }
        cur = stop;
    }
    if (cur < end) {
        *why = "page " + hex(cur) + " is not mapped";
        return EFAULT;
    }
    return 0;
}

PinnedVm &PinnedVm::instance() {
    static PinnedVm vm;
    return vm;
}

int PinnedVm::charge(uint64_t pages, std::string *why) {
    rlimit rl{};
    if (::getrlimit(RLIMIT_MEMLOCK, &rl) != 0) {
        rl.rlim_cur = RLIM_INFINITY;
    }
    const uint64_t limit =
        rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : static_cast<uint64_t>(rl.rlim_cur) / pageSize();
    std::lock_guard lock(mu_);
    const pid_t self = ::getpid();
    if (pid_ != self) {
        pid_ = self;  // a forked child: its mm's pinned_vm starts at zero (mm_init)
        pages_ = 0;
    }
    if (rl.rlim_cur == 0 && !hasIpcLock()) {
        *why = "RLIMIT_MEMLOCK is 0 and the process lacks CAP_IPC_LOCK";
        return EPERM;
    }
    if (pages > limit - (pages_ < limit ? pages_ : limit) && !hasIpcLock()) {
        *why = std::to_string(pages_) + " pages pinned + " + std::to_string(pages) +
               " would pass RLIMIT_MEMLOCK (" + std::to_string(limit) +
               " pages) and the process lacks CAP_IPC_LOCK";
        return ENOMEM;
    }
    pages_ += pages;
    return 0;
}

void PinnedVm::uncharge(pid_t owner, uint64_t pages) {
    std::lock_guard lock(mu_);
    if (owner == pid_) {
        pages_ -= pages < pages_ ? pages : pages_;
    }
}

int dmabufSize(int fd, uint64_t *size) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        return errno == EBADF ? EBADF : ENODATA;
    }
    if (S_ISREG(st.st_mode)) {
        *size = static_cast<uint64_t>(st.st_size);
        return 0;
    }
    // dma_buf_llseek() answers SEEK_END with dmabuf->size and leaves f_pos alone.
    const off_t end = ::lseek(fd, 0, SEEK_END);
    if (end < 0) {
        return ENODATA;
    }
    *size = static_cast<uint64_t>(end);
    return 0;
}

}  // namespace tensorlane::simhca
