// One RC queue pair's attributes and its RESET -> INIT -> RTR -> RTS transitions with exactly
// the attribute masks ibv_modify_qp(3) requires for each (the kernel's ib_modify_qp_is_ok
// table refuses a missing or an extra bit). The parameters are kept so a QP can be rebuilt
// after a port flap or a GID change.
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "tensorlane/sidecar/status.hpp"
#include "transport/verbs/objects.hpp"

namespace tensorlane::sidecar {

/// Everything that shapes an RC queue pair, from the config and the fabric selection.
struct QpParams {
    uint8_t port = 1;
    uint8_t sgid_index = 0;
    ibv_mtu path_mtu = IBV_MTU_1024;
    /// GRH traffic class: DSCP << 2 | ECN bits (docs/fabric.md).
    uint8_t traffic_class = 0;
    /// Service level: the PFC priority on RoCE.
    uint8_t sl = 0;
    uint8_t hop_limit = 64;
    uint8_t timeout = 18;
    uint8_t retry_cnt = 7;
    uint8_t rnr_retry = 7;
    uint8_t min_rnr_timer = 12;
    uint32_t max_send_wr = 256;
    uint32_t max_recv_wr = 256;
    uint32_t max_inline = 64;
};

/// What the other end needs to connect to one of our QPs.
struct QpEndpoint {
    uint32_t qpn = 0;
    uint32_t psn = 0;  ///< 24 bits, random
};

/// The IB MTU enumerator for a size in bytes (256..4096), IBV_MTU_1024 for anything else.
ibv_mtu mtuEnum(uint32_t bytes);
/// The size in bytes of an IB MTU enumerator.
uint32_t mtuBytes(ibv_mtu mtu);
/// A random 24-bit PSN (IB spec 9.7.1: any start value; random ones keep a stale packet of an
/// earlier QP with the same number from looking current).
uint32_t randomPsn();

/// Creates an RC QP on `pd` with the two CQs; errno text in the status on failure.
Status createRcQp(ibv_pd *pd, ibv_cq *send_cq, ibv_cq *recv_cq, const QpParams &p,
                  verbs_detail::QpPtr *out);
/// RESET -> INIT: STATE | PKEY_INDEX | PORT | ACCESS_FLAGS.
Status qpToInit(ibv_qp *qp, const QpParams &p, unsigned access);
/// INIT -> RTR: STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC |
/// MIN_RNR_TIMER. On RoCE the address vector is global: the GRH carries the destination GID,
/// our GID index, the hop limit and the traffic class.
Status qpToRtr(ibv_qp *qp, const QpParams &p, const QpEndpoint &remote,
               const std::array<uint8_t, 16> &remote_gid);
/// RTR -> RTS: STATE | TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC.
Status qpToRts(ibv_qp *qp, const QpParams &p, uint32_t local_psn);
/// Any state -> ERR (flushes what is outstanding).
void qpToError(ibv_qp *qp);
/// "RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR", or "?".
const char *qpStateName(ibv_qp_state s);
/// The state `qp` is in now, by name ("?" when ibv_query_qp fails).
const char *qpStateNow(ibv_qp *qp);
/// Arms `cq`, then looks: true when it is armed with nothing in it. A completion that came
/// before the arm is seen by the look and kept in `stash` for the next poll (false: do not
/// sleep); one after it raises the channel (ibv_req_notify_cq(3)).
bool armCq(ibv_cq *cq, std::vector<ibv_wc> &stash);

}  // namespace tensorlane::sidecar
