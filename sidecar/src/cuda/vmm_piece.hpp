// One piece of a client's VMM registration as the sidecar holds it between the kVmmPieces
// message that brought it and the mapping that consumes it (docs/gpu.md, "VMM memory").
#pragma once

#include <cstdint>

#include "tensorlane/ipc/fd.hpp"

namespace tensorlane::sidecar {

struct VmmPieceFd {
    uint64_t offset = 0;  ///< in the registered span
    uint64_t bytes = 0;   ///< what the client says the physical allocation holds
    ipc::UniqueFd fd;     ///< its POSIX fd (cuMemExportToShareableHandle)
};

}  // namespace tensorlane::sidecar
