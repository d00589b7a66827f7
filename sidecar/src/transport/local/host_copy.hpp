// Host-to-host copies of the local transport, in slices: memcpy, with non-temporal stores for
// writes larger than a quarter of the last-level cache. Used by the engine thread for small
// writes (inline_host_copies.hpp) and by the copy thread for the rest, a slice a turn
// (copy_thread.hpp).
#pragma once

#include <cstdint>

#include "transport/local/local_job.hpp"

namespace tensorlane::sidecar {

/// Bytes copied per turn of the copy thread before it looks at other sessions' writes.
inline constexpr uint64_t kHostSliceBytes = 512 * 1024;

/// Copies the next slice of a host-to-host `job` of session `sid` (checking the write first,
/// when nothing of it is copied yet); true when it has ended, with its verdict in `*done`
/// (the bytes fenced and visible before that).
bool copyHostSlice(LocalJob &job, SessionId sid, LocalDone *done);

}  // namespace tensorlane::sidecar
