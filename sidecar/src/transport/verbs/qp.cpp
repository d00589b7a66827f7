#include "transport/verbs/qp.hpp"

#include <sodium.h>

#include <cerrno>
#include <cstring>

namespace tensorlane::sidecar {

namespace {

Status fail(const char *what, int err) {
    return {Code::kPeer, std::string(what) + ": " + std::strerror(err)};
}

}  // namespace

ibv_mtu mtuEnum(uint32_t bytes) {
    switch (bytes) {
        case 256:
            return IBV_MTU_256;
        case 512:
            return IBV_MTU_512;
        case 2048:
            return IBV_MTU_2048;
        case 4096:
            return IBV_MTU_4096;
        default:
            return IBV_MTU_1024;
    }
}

uint32_t mtuBytes(ibv_mtu mtu) {
    return 128u << static_cast<unsigned>(mtu);  // IBV_MTU_256 is 1
}

uint32_t randomPsn() {
    return randombytes_uniform(1u << 24);
}

Status createRcQp(ibv_pd *pd, ibv_cq *send_cq, ibv_cq *recv_cq, const QpParams &p,
                  verbs_detail::QpPtr *out) {
    ibv_qp_init_attr init{};
    init.send_cq = send_cq;
    init.recv_cq = recv_cq;
    init.qp_type = IBV_QPT_RC;
    // Selective signalling: each write signals only its last work request per QP.
    init.sq_sig_all = 0;
    init.cap.max_send_wr = p.max_send_wr;
    init.cap.max_recv_wr = p.max_recv_wr;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    init.cap.max_inline_data = p.max_inline;
    ibv_qp *qp = ibv_create_qp(pd, &init);
    if (qp == nullptr) {
        // ibv_create_qp returns NULL and sets errno (ibv_create_qp(3)).
        return fail("ibv_create_qp", errno);
    }
    out->reset(qp);
    return Status::ok();
}

Status qpToInit(ibv_qp *qp, const QpParams &p, unsigned access) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = p.port;
    a.qp_access_flags = access;
    // ibv_modify_qp returns the errno value itself (ibv_modify_qp(3)).
    if (int rc = ibv_modify_qp(
            qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
        return fail("ibv_modify_qp RESET->INIT", rc);
    }
    return Status::ok();
}

Status qpToRtr(ibv_qp *qp, const QpParams &p, const QpEndpoint &remote,
               const std::array<uint8_t, 16> &remote_gid) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = p.path_mtu;
    a.dest_qp_num = remote.qpn;
    a.rq_psn = remote.psn;
    a.max_dest_rd_atomic = 1;  // the GDR flush reads through a loopback QP
    a.min_rnr_timer = p.min_rnr_timer;
    a.ah_attr.is_global = 1;  // RoCE: the GRH is how packets are routed
    std::memcpy(a.ah_attr.grh.dgid.raw, remote_gid.data(), 16);
    a.ah_attr.grh.sgid_index = p.sgid_index;
    a.ah_attr.grh.hop_limit = p.hop_limit;
    a.ah_attr.grh.traffic_class = p.traffic_class;
    a.ah_attr.grh.flow_label = 0;
    a.ah_attr.dlid = 0;
    a.ah_attr.sl = p.sl;
    a.ah_attr.src_path_bits = 0;
    a.ah_attr.port_num = p.port;
    if (int rc =
            ibv_modify_qp(qp, &a,
                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                              IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
        return fail("ibv_modify_qp INIT->RTR", rc);
    }
    return Status::ok();
}

Status qpToRts(ibv_qp *qp, const QpParams &p, uint32_t local_psn) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = p.timeout;
    a.retry_cnt = p.retry_cnt;
    a.rnr_retry = p.rnr_retry;
    a.sq_psn = local_psn;
    a.max_rd_atomic = 1;
    if (int rc = ibv_modify_qp(qp, &a,
                               IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                   IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC)) {
        return fail("ibv_modify_qp RTR->RTS", rc);
    }
    return Status::ok();
}

void qpToError(ibv_qp *qp) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    (void)ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

const char *qpStateName(ibv_qp_state s) {
    switch (s) {
        case IBV_QPS_RESET:
            return "RESET";
        case IBV_QPS_INIT:
            return "INIT";
        case IBV_QPS_RTR:
            return "RTR";
        case IBV_QPS_RTS:
            return "RTS";
        case IBV_QPS_SQD:
            return "SQD";
        case IBV_QPS_SQE:
            return "SQE";
        case IBV_QPS_ERR:
            return "ERR";
        default:
            return "?";
    }
}

const char *qpStateNow(ibv_qp *qp) {
    ibv_qp_attr a{};
    ibv_qp_init_attr ia{};
    return ibv_query_qp(qp, &a, IBV_QP_STATE, &ia) == 0 ? qpStateName(a.qp_state) : "?";
}

bool armCq(ibv_cq *cq, std::vector<ibv_wc> &stash) {
    if (!stash.empty()) {
        return false;
    }
    if (ibv_req_notify_cq(cq, 0) != 0) {
        return false;
    }
    ibv_wc wcs[16];
    const int n = ibv_poll_cq(cq, 16, wcs);
    if (n > 0) {
        stash.insert(stash.end(), wcs, wcs + n);
        return false;
    }
    return true;
}

}  // namespace tensorlane::sidecar
