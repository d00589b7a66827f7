#include "tensorlane/ipc/shm.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <cstring>
#include <random>
#include <utility>

namespace bip = boost::interprocess;

namespace tensorlane::ipc {

Mapping::Mapping(Mapping &&o) noexcept
    : addr_(std::exchange(o.addr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

Mapping &Mapping::operator=(Mapping &&o) noexcept {
    if (this != &o) {
        if (addr_) {
            ::munmap(addr_, bytes_);
        }
        addr_ = std::exchange(o.addr_, nullptr);
        bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
}

Mapping::~Mapping() {
    if (addr_) {
        ::munmap(addr_, bytes_);
    }
}

int mapSegment(int fd, size_t bytes, Mapping *out) {
    void *p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        return errno;
    }
    *out = Mapping(p, bytes);
    return 0;
}

uint64_t segmentSize(int fd) {
    struct stat st;
    if (::fstat(fd, &st) != 0 || st.st_size < 0) {
        return 0;
    }
    return static_cast<uint64_t>(st.st_size);
}

int createSegment(size_t bytes, uid_t owner_uid, gid_t owner_gid, SharedSegment *out,
                  std::string *error) {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    if (bytes == 0 || bytes > (size_t{1} << 46)) {
        *error = "segment size out of range";
        return EINVAL;
    }
    bytes = (bytes + page - 1) / page * page;

    // A random name that nobody can guess; it lives only between create and remove below.
    std::random_device rd;
    char name[64];
    std::snprintf(name, sizeof(name), "tensorlane-%08x%08x", rd(), rd());

    bip::permissions perm(0600);
    UniqueFd dup_fd;
    try {
        bip::shared_memory_object shm(bip::create_only, name, bip::read_write, perm);
        // From here on the name must go, whatever happens: the fd is all anyone needs.
        struct Remover {
            const char *n;
            ~Remover() { bip::shared_memory_object::remove(n); }
        } remover{name};
        shm.truncate(static_cast<bip::offset_t>(bytes));
        int fd = shm.get_mapping_handle().handle;
        // Owned by the client so that it may map it; the mode keeps everyone else out.
        if (::fchown(fd, owner_uid, owner_gid) != 0 && ::geteuid() == 0) {
            int err = errno;
            *error = std::string("fchown: ") + std::strerror(err);
            return err;
        }
        ::fchmod(fd, 0600);
        // Boost's object closes its fd on destruction; keep our own duplicate.
        dup_fd.reset(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
        if (!dup_fd) {
            int err = errno;
            *error = std::string("dup: ") + std::strerror(err);
            return err;
        }
        bip::mapped_region region(shm, bip::read_write, 0, bytes);
        // Boost's mapped_region would unmap on destruction: map again by fd and own that.
        Mapping m;
        if (int rc = mapSegment(dup_fd.get(), bytes, &m)) {
            *error = std::string("mmap: ") + std::strerror(rc);
            return rc;
        }
        out->fd = std::move(dup_fd);
        out->mapping = std::move(m);
        return 0;
    } catch (const bip::interprocess_exception &e) {
        *error = std::string("shared memory: ") + e.what();
        int err = e.get_native_error();
        return err ? err : ENOMEM;
    }
}

}  // namespace tensorlane::ipc
