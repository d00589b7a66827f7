// Status codes shared by the wire formats, the sidecar and the shim. The numeric values are the
// public C ABI's tl_status values (shim/include/tensorlane/tensorlane.h static_asserts that).
#pragma once

#include <cstdint>

namespace tensorlane::ipc {

/// What a request, a control call or a session ended with. Values travel in shared memory and
/// over the control socket, so they never change; new codes are only appended.
enum class Code : int32_t {
    kOk = 0,
    kInvalid = 1,     ///< dooms one request: wrong on its face
    kNotFound = 2,    ///< unknown region, peer or name; a revoked region
    kPermission = 3,  ///< credentials or exposure do not allow it
    kNoMemory = 4,
    kAgain = 5,  ///< ring full; try again
    kTimedOut = 6,
    kPeer = 7,        ///< dooms the peer: unreachable or failed
    kConnection = 8,  ///< dooms the client: sidecar gone
    kCuda = 9,
    kInternal = 10,
    /// A write's deadline (tl_send_opts.timeout_ms) passed before it ended: it failed, unlike
    /// kTimedOut, which a wait returns when the ticket is still pending.
    kDeadline = 11,
};
/// The largest code (sanitizeCode maps anything past it to kInternal).
inline constexpr Code kLastCode = Code::kDeadline;

/// A short fixed name for a code ("TL_EPEER"); never NULL.
constexpr const char *codeName(Code c) {
    switch (c) {
        case Code::kOk:
            return "TL_OK";
        case Code::kInvalid:
            return "TL_EINVAL";
        case Code::kNotFound:
            return "TL_ENOENT";
        case Code::kPermission:
            return "TL_EPERM";
        case Code::kNoMemory:
            return "TL_ENOMEM";
        case Code::kAgain:
            return "TL_EAGAIN";
        case Code::kTimedOut:
            return "TL_ETIMEDOUT";
        case Code::kPeer:
            return "TL_EPEER";
        case Code::kConnection:
            return "TL_ECONN";
        case Code::kCuda:
            return "TL_ECUDA";
        case Code::kInternal:
            return "TL_EINTERNAL";
        case Code::kDeadline:
            return "TL_EDEADLINE";
    }
    return "TL_EUNKNOWN";
}

/// Maps a code read from an untrusted source to a known one.
constexpr Code sanitizeCode(int32_t raw) {
    return (raw >= 0 && raw <= static_cast<int32_t>(kLastCode)) ? static_cast<Code>(raw)
                                                                : Code::kInternal;
}

}  // namespace tensorlane::ipc
