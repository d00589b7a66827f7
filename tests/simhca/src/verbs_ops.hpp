// The provider entry points a context publishes through ibv_context_ops and verbs_context (the
// header's inline ibv_post_send(), ibv_poll_cq(), ibv_query_port() and friends call these).
#pragma once

#include <infiniband/verbs.h>

namespace tensorlane::simhca::ops {

/// ops.poll_cq
int pollCq(ibv_cq *cq, int n, ibv_wc *wc);
/// ops.req_notify_cq
int reqNotifyCq(ibv_cq *cq, int solicited_only);
/// ops.post_send
int postSend(ibv_qp *qp, ibv_send_wr *wr, ibv_send_wr **bad);
/// ops.post_recv
int postRecv(ibv_qp *qp, ibv_recv_wr *wr, ibv_recv_wr **bad);
/// ops.post_srq_recv: SRQs are not modelled.
int postSrqRecv(ibv_srq *srq, ibv_recv_wr *wr, ibv_recv_wr **bad);
/// ops.alloc_mw: memory windows are not modelled.
ibv_mw *allocMw(ibv_pd *pd, ibv_mw_type type);
/// ops.bind_mw
int bindMw(ibv_qp *qp, ibv_mw *mw, ibv_mw_bind *bind);
/// ops.dealloc_mw
int deallocMw(ibv_mw *mw);
/// verbs_context::query_port (___ibv_query_port() calls it with sizeof its struct).
int queryPort(ibv_context *ctx, uint8_t port, ibv_port_attr *attr, size_t attr_len);
/// verbs_context::query_device_ex
int queryDeviceEx(ibv_context *ctx, const ibv_query_device_ex_input *input,
                  ibv_device_attr_ex *attr, size_t attr_size);
/// verbs_context::create_cq_ex
ibv_cq_ex *createCqEx(ibv_context *ctx, ibv_cq_init_attr_ex *attr);
/// verbs_context::create_qp_ex
ibv_qp *createQpEx(ibv_context *ctx, ibv_qp_init_attr_ex *attr);
/// verbs_context::query_rt_values
int queryRtValues(ibv_context *ctx, ibv_values_ex *values);

}  // namespace tensorlane::simhca::ops
