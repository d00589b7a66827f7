// The QP state machine of ib_modify_qp_is_ok() (drivers/infiniband/core/verbs.c, the
// qp_state_table), for RC: which transitions exist and which attribute masks each requires and
// allows. ibv_modify_qp() fails with EINVAL wherever this says no, as the kernel's does.
#pragma once

#include <infiniband/verbs.h>

namespace tensorlane::simhca {

/// Whether an RC QP in cur may move to next with exactly the attributes in mask.
[[nodiscard]] bool modifyQpIsOk(ibv_qp_state cur, ibv_qp_state next, int mask);

}  // namespace tensorlane::simhca
