#include "tensorlane/ipc/shm.hpp"

#include "tensorlane/ipc/memory_limits.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/interprocess/mapped_region.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>

namespace bip = boost::interprocess;

namespace tensorlane::ipc {
namespace {

/// What Boost.Interprocess's mapped_region needs of a mappable object: the fd behind it. A
/// memfd is neither a bip::shared_memory_object nor a file_mapping, so it is wrapped.
class MemfdMappable {
public:
    explicit MemfdMappable(int fd) : fd_(fd) {}
    bip::mapping_handle_t get_mapping_handle() const {
        return bip::ipcdetail::mapping_handle_from_file_handle(fd_);
    }

private:
    int fd_;
};

/// The seals a segment carries before its fd leaves the sidecar: its size can never change
/// again (memfd_create(2), fcntl(2) "File Sealing"). A client that ftruncates its fd gets
/// EPERM, so no mapping of the sidecar's can ever point past the end of the object (SIGBUS).
constexpr int kSegmentSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

}  // namespace

uint64_t availableMemory() {
    const std::string root = memoryRoot();
    const uint64_t avail = readMeminfo(root, "MemAvailable");
    return std::min(avail == 0 ? UINT64_MAX : avail, readCgroupMemory(root).room());
}

Mapping::Mapping(bip::mapped_region &&region)
    : region_(new bip::mapped_region(std::move(region))),
      addr_(region_->get_address()),
      bytes_(region_->get_size()) {}

Mapping::Mapping(Mapping &&o) noexcept
    : region_(std::move(o.region_)),
      addr_(std::exchange(o.addr_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)) {}

Mapping &Mapping::operator=(Mapping &&o) noexcept {
    if (this != &o) {
        region_ = std::move(o.region_);  // unmaps ours first
        addr_ = std::exchange(o.addr_, nullptr);
        bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
}

void Mapping::RegionDeleter::operator()(bip::mapped_region *r) const {
    delete r;  // its destructor unmaps
}

int mapSegment(int fd, size_t bytes, Mapping *out) {
    if (fd < 0) {
        return EBADF;
    }
    if (bytes == 0) {
        return EINVAL;
    }
    try {
        bip::mapped_region region(MemfdMappable(fd), bip::read_write, 0, bytes);
        *out = Mapping(std::move(region));
        return 0;
    } catch (const bip::interprocess_exception &e) {
        const int err = e.get_native_error();
        return err ? err : ENOMEM;
    }
}

uint64_t segmentSize(int fd) {
    struct stat st;
    if (::fstat(fd, &st) != 0 || st.st_size < 0) {
        return 0;
    }
    return static_cast<uint64_t>(st.st_size);
}

bool isSealedSegment(int fd) {
    const int seals = ::fcntl(fd, F_GET_SEALS);
    return seals >= 0 && (seals & kSegmentSeals) == kSegmentSeals;
}

int createSegment(size_t bytes, uid_t owner_uid, gid_t owner_gid, SharedSegment *out,
                  std::string *error) {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    if (bytes == 0 || bytes > (size_t{1} << 46)) {
        *error = "segment size out of range";
        return EINVAL;
    }
    bytes = (bytes + page - 1) / page * page;
    // A memfd has no size limit of its own: backing more than the machine (or our cgroup) has
    // would wake the OOM killer, which may pick any process, instead of failing here.
    constexpr uint64_t kHeadroom = uint64_t{64} << 20;
    const uint64_t avail = availableMemory();
    if (avail != UINT64_MAX && bytes + kHeadroom > avail) {
        *error = "not enough memory for " + std::to_string(bytes) + " bytes of shared memory (" +
                 std::to_string(avail >> 20) + " MiB available)";
        return ENOMEM;
    }

    // An anonymous memfd: no name anyone could open, and it can be sealed, which a POSIX shm
    // object cannot. The fd travels to the client with SCM_RIGHTS.
    UniqueFd fd(::memfd_create("tensorlane-segment", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!fd) {
        const int err = errno;
        *error = std::string("memfd_create: ") + std::strerror(err);
        return err;
    }
    if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
        const int err = errno;
        *error = std::string("ftruncate: ") + std::strerror(err);
        return err;
    }
    // Allocate every page now: a full tmpfs or memory cgroup is an error here, at allocation,
    // never a SIGBUS later when the sidecar or the client first touches a page.
    if (int rc = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(bytes)); rc != 0) {
        *error = "cannot back " + std::to_string(bytes) +
                 " bytes of shared memory: " + std::strerror(rc);
        return rc == EINVAL || rc == EOPNOTSUPP ? ENOMEM : rc;
    }
    if (::fcntl(fd.get(), F_ADD_SEALS, kSegmentSeals) != 0) {
        const int err = errno;
        *error = std::string("F_ADD_SEALS: ") + std::strerror(err);
        return err;
    }
    // Owned by the client so that it may map it (and reopen it through /proc/self/fd); the
    // mode keeps everyone else out.
    if (::fchown(fd.get(), owner_uid, owner_gid) != 0 && ::geteuid() == 0) {
        const int err = errno;
        *error = std::string("fchown: ") + std::strerror(err);
        return err;
    }
    ::fchmod(fd.get(), 0600);
    try {
        bip::mapped_region region(MemfdMappable(fd.get()), bip::read_write, 0, bytes);
        out->mapping = Mapping(std::move(region));
    } catch (const bip::interprocess_exception &e) {
        *error = std::string("mmap: ") + e.what();
        const int err = e.get_native_error();
        return err ? err : ENOMEM;
    }
    out->fd = std::move(fd);
    return 0;
}

}  // namespace tensorlane::ipc
