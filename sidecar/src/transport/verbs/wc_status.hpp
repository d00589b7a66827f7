// What a work completion's status means for the write and for the operator: the tl status it
// ends the write with, and the likely cause (the most common user failures on RoCE are a wrong
// GID index, a traffic class the switches do not carry losslessly, and PFC/ECN off on that
// priority; NCCL's net_ib prints hints the same way).
#pragma once

#include <infiniband/verbs.h>

#include "tensorlane/sidecar/status.hpp"

namespace tensorlane::sidecar {

struct WcMeaning {
    Code code = Code::kInternal;
    /// One line for the log: what it is and what to check.
    const char *hint = "";
};

/// The meaning of every ibv_wc_status.
WcMeaning meaningOf(ibv_wc_status status);

}  // namespace tensorlane::sidecar
