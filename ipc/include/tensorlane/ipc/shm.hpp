// Shared-memory segments: created by the sidecar with Boost.Interprocess under a random name that
// is removed at once (the fd travels with SCM_RIGHTS), mode 0600, owned by the client's uid.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "tensorlane/ipc/fd.hpp"

namespace tensorlane::ipc {

/// One mapping of a shared-memory object, unmapped on destruction. Move-only.
class Mapping {
public:
    Mapping() = default;
    Mapping(void *addr, size_t bytes) : addr_(addr), bytes_(bytes) {}
    Mapping(Mapping &&o) noexcept;
    Mapping &operator=(Mapping &&o) noexcept;
    Mapping(const Mapping &) = delete;
    Mapping &operator=(const Mapping &) = delete;
    ~Mapping();

    void *data() const { return addr_; }
    size_t size() const { return bytes_; }
    explicit operator bool() const { return addr_ != nullptr; }

private:
    void *addr_ = nullptr;
    size_t bytes_ = 0;
};

/// A segment the sidecar made: its fd (to send) and the sidecar's own mapping.
struct SharedSegment {
    UniqueFd fd;
    Mapping mapping;
};

/// Creates a zero-filled segment of `bytes` (rounded up to a page), owned by `owner_uid` with
/// mode 0600, leaves no name behind in /dev/shm, and maps it read-write. `*error` gets a
/// reason on failure. Returns 0 or an errno value.
int createSegment(size_t bytes, uid_t owner_uid, gid_t owner_gid, SharedSegment *out,
                  std::string *error);

/// Maps `bytes` of `fd` read-write, shared. Returns 0 or an errno value.
int mapSegment(int fd, size_t bytes, Mapping *out);

/// The size of the object behind `fd` (fstat), or 0 on error.
uint64_t segmentSize(int fd);

}  // namespace tensorlane::ipc
