// The "new post send" API of ibv_qp_ex (ibv_wr_post(3)): ibv_wr_start(), the ibv_wr_<op>()
// builders, ibv_wr_set_sge*() / ibv_wr_set_inline_data*(), ibv_wr_complete(). The simulator
// collects the WRs and posts them as one list through SimQp::postSend().
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <vector>

namespace tensorlane::simhca {

/// The WRs being built between ibv_wr_start() and ibv_wr_complete().
struct QpExBatch {
    std::vector<ibv_send_wr> wrs;
    std::vector<uint32_t> sge_first;  ///< per WR: index of its first SGE in sges
    std::vector<ibv_sge> sges;
    std::vector<uint8_t> inline_bytes;
    int error = 0;
};

/// Points the function members of qpx at the simulator's builders.
void installQpExOps(ibv_qp_ex *qpx);

}  // namespace tensorlane::simhca
