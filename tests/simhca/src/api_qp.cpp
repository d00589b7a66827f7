// Exported verbs: queue pairs (ibv_create_qp(3), ibv_create_qp_ex(3), ibv_modify_qp(3),
// ibv_query_qp(3), ibv_post_send(3), ibv_post_recv(3)); SRQs, address handles, multicast and
// ECE, which the simulator does not model, fail as a device without them does.
#include <infiniband/verbs.h>

#include <cerrno>

#include "context.hpp"
#include "device.hpp"
#include "engine.hpp"
#include "log.hpp"
#include "qp.hpp"
#include "simulator.hpp"
#include "verbs_ops.hpp"

using namespace tensorlane::simhca;

extern "C" {

ibv_qp *ibv_create_qp(ibv_pd *pd, ibv_qp_init_attr *attr) {
    ibv_qp_init_attr_ex ex{};
    ex.qp_context = attr->qp_context;
    ex.send_cq = attr->send_cq;
    ex.recv_cq = attr->recv_cq;
    ex.srq = attr->srq;
    ex.cap = attr->cap;
    ex.qp_type = attr->qp_type;
    ex.sq_sig_all = attr->sq_sig_all;
    ex.comp_mask = IBV_QP_INIT_ATTR_PD;
    ex.pd = pd;
    ibv_qp *qp = ops::createQpEx(pd->context, &ex);
    if (qp != nullptr) {
        attr->cap = ex.cap;
    }
    return qp;
}

int ibv_query_qp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask, ibv_qp_init_attr *init_attr) {
    return SimQp::from(qp)->query(*attr, attr_mask, *init_attr);
}

int ibv_modify_qp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask) {
    return SimQp::from(qp)->modify(*attr, attr_mask);
}

int ibv_destroy_qp(ibv_qp *qp) {
    SimQp *q = SimQp::from(qp);
    SimContext *ctx = SimContext::from(qp->context);
    Simulator::instance().engine()->removeQp(q, &ctx->device());
    // After removeQp no new event of it can be queued; then its events go, as the kernel's.
    ctx->events().forget(qp);
    delete q;
    return 0;
}

ibv_qp_ex *ibv_qp_to_qp_ex(ibv_qp *qp) {
    return SimQp::from(qp)->ibvEx();
}

int ibv_query_ece(ibv_qp *, ibv_ece *) {
    return EOPNOTSUPP;
}

int ibv_set_ece(ibv_qp *, ibv_ece *) {
    return EOPNOTSUPP;
}

// RC on this simulator places data in PSN order, as the IB spec requires of any RC responder.
int ibv_query_qp_data_in_order(ibv_qp *, ibv_wr_opcode, uint32_t) {
    return 1;
}

ibv_srq *ibv_create_srq(ibv_pd *, ibv_srq_init_attr *) {
    errno = EOPNOTSUPP;  // shared receive queues are not modelled
    return nullptr;
}

int ibv_modify_srq(ibv_srq *, ibv_srq_attr *, int) {
    return EOPNOTSUPP;
}

int ibv_query_srq(ibv_srq *, ibv_srq_attr *) {
    return EOPNOTSUPP;
}

int ibv_destroy_srq(ibv_srq *) {
    return EOPNOTSUPP;
}

ibv_ah *ibv_create_ah(ibv_pd *, ibv_ah_attr *) {
    errno = EOPNOTSUPP;  // address handles serve UD, which is not modelled
    return nullptr;
}

int ibv_destroy_ah(ibv_ah *) {
    return EOPNOTSUPP;
}

int ibv_init_ah_from_wc(ibv_context *, uint8_t, ibv_wc *, ibv_grh *, ibv_ah_attr *) {
    return EOPNOTSUPP;
}

ibv_ah *ibv_create_ah_from_wc(ibv_pd *, ibv_wc *, ibv_grh *, uint8_t) {
    errno = EOPNOTSUPP;
    return nullptr;
}

int ibv_attach_mcast(ibv_qp *, const ibv_gid *, uint16_t) {
    return EOPNOTSUPP;
}

int ibv_detach_mcast(ibv_qp *, const ibv_gid *, uint16_t) {
    return EOPNOTSUPP;
}

}  // extern "C"

namespace tensorlane::simhca::ops {

ibv_qp *createQpEx(ibv_context *ctx, ibv_qp_init_attr_ex *attr) {
    if (attr->qp_type != IBV_QPT_RC) {
        log(LogLevel::kInfo, "ibv_create_qp: only RC QPs are simulated");
        errno = EOPNOTSUPP;
        return nullptr;
    }
    if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || attr->pd == nullptr ||
        attr->send_cq == nullptr || attr->recv_cq == nullptr) {
        errno = EINVAL;
        return nullptr;
    }
    if (attr->srq != nullptr) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    const uint32_t supported = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    if (attr->comp_mask & ~supported) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    const ibv_qp_cap &c = attr->cap;
    if (c.max_send_wr > kMaxQpWr || c.max_recv_wr > kMaxQpWr || c.max_send_sge > kMaxSge ||
        c.max_recv_sge > kMaxSge || c.max_inline_data > kMaxInline) {
        errno = EINVAL;  // ibv_create_qp(3): caps above the device's limits
        return nullptr;
    }
    SimContext *sctx = SimContext::from(ctx);
    Engine *engine = Simulator::instance().engine();
    auto *qp = new SimQp(sctx, *attr, engine->allocateQpn(), engine);
    if (const int err = engine->addQp(qp, &sctx->device()); err != 0) {
        delete qp;
        errno = err;
        return nullptr;
    }
    return qp->ibv();
}

int postSend(ibv_qp *qp, ibv_send_wr *wr, ibv_send_wr **bad) {
    return SimQp::from(qp)->postSend(wr, bad);
}

int postRecv(ibv_qp *qp, ibv_recv_wr *wr, ibv_recv_wr **bad) {
    return SimQp::from(qp)->postRecv(wr, bad);
}

int postSrqRecv(ibv_srq *, ibv_recv_wr *wr, ibv_recv_wr **bad) {
    *bad = wr;
    return EOPNOTSUPP;
}

}  // namespace tensorlane::simhca::ops
