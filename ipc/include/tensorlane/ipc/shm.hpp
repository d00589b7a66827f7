// Shared-memory segments: anonymous memfds created by the sidecar, backed up front, sealed
// against any change of size before their fd leaves (SCM_RIGHTS), mode 0600, owned by the
// client's uid; mapped in both processes with Boost.Interprocess.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tensorlane/ipc/fd.hpp"

namespace boost::interprocess {
class mapped_region;
}

namespace tensorlane::ipc {

/// One mapping of a shared-memory object (a Boost.Interprocess mapped_region), unmapped on
/// destruction. Move-only.
class Mapping {
public:
    Mapping() = default;
    /// Takes over a mapped region.
    explicit Mapping(boost::interprocess::mapped_region &&region);
    Mapping(Mapping &&o) noexcept;
    Mapping &operator=(Mapping &&o) noexcept;
    Mapping(const Mapping &) = delete;
    Mapping &operator=(const Mapping &) = delete;
    ~Mapping() = default;

    void *data() const { return addr_; }
    size_t size() const { return bytes_; }
    explicit operator bool() const { return addr_ != nullptr; }

private:
    struct RegionDeleter {
        void operator()(boost::interprocess::mapped_region *r) const;
    };
    std::unique_ptr<boost::interprocess::mapped_region, RegionDeleter> region_;
    void *addr_ = nullptr;
    size_t bytes_ = 0;
};

/// A segment the sidecar made: its fd (to send) and the sidecar's own mapping.
struct SharedSegment {
    UniqueFd fd;
    Mapping mapping;
};

/// Creates a zero-filled segment of `bytes` (rounded up to a page): a memfd with every page
/// allocated (a full tmpfs is ENOSPC here, never a SIGBUS later) and sealed so that its size can
/// never change (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), owned by `owner_uid` with mode
/// 0600, mapped read-write. `*error` gets a reason on failure. Returns 0 or an errno value.
int createSegment(size_t bytes, uid_t owner_uid, gid_t owner_gid, SharedSegment *out,
                  std::string *error);

/// Maps `bytes` of `fd` read-write, shared. Returns 0 or an errno value.
int mapSegment(int fd, size_t bytes, Mapping *out);

/// The size of the object behind `fd` (fstat), or 0 on error.
uint64_t segmentSize(int fd);

/// Memory a new segment may take: MemAvailable, or less when this process's cgroup (v2 or v1,
/// memory_limits.hpp) has less room. UINT64_MAX when neither is known.
uint64_t availableMemory();

/// True when `fd` is a memfd whose size can no longer change (the seals createSegment adds).
bool isSealedSegment(int fd);

}  // namespace tensorlane::ipc
