// Exported verbs: completion channels and CQs (ibv_create_comp_channel(3), ibv_create_cq(3),
// ibv_create_cq_ex(3), ibv_poll_cq(3), ibv_req_notify_cq(3), ibv_get_cq_event(3)).
#include <infiniband/verbs.h>

#include <cerrno>

#include "comp_channel.hpp"
#include "context.hpp"
#include "cq.hpp"
#include "qp.hpp"
#include "verbs_ops.hpp"

using namespace tensorlane::simhca;

namespace {

ibv_cq_ex *createCq(ibv_context *ctx, int cqe, void *cq_context, ibv_comp_channel *channel,
                    int comp_vector, uint64_t wc_flags) {
    if (cqe < 1 || static_cast<uint32_t>(cqe) > kMaxCqe || comp_vector < 0 ||
        comp_vector >= ctx->num_comp_vectors) {
        errno = EINVAL;
        return nullptr;
    }
    auto *cq = new SimCq(SimContext::from(ctx), cqe, channel ? CompChannel::from(channel) : nullptr,
                         cq_context, wc_flags);
    return cq->ibvEx();
}

}  // namespace

extern "C" {

ibv_comp_channel *ibv_create_comp_channel(ibv_context *context) {
    return (new CompChannel(context))->ibv();
}

int ibv_destroy_comp_channel(ibv_comp_channel *channel) {
    if (channel->refcnt != 0) {
        return EBUSY;  // CQs still use it (ibv_destroy_comp_channel(3))
    }
    delete CompChannel::from(channel);
    return 0;
}

ibv_cq *ibv_create_cq(ibv_context *context, int cqe, void *cq_context, ibv_comp_channel *channel,
                      int comp_vector) {
    ibv_cq_ex *cq = createCq(context, cqe, cq_context, channel, comp_vector, 0);
    if (cq != nullptr && channel != nullptr) {
        ++channel->refcnt;
    }
    return cq != nullptr ? ibv_cq_ex_to_cq(cq) : nullptr;
}

int ibv_resize_cq(ibv_cq *cq, int cqe) {
    return SimCq::from(cq)->resize(cqe);
}

int ibv_destroy_cq(ibv_cq *cq) {
    SimCq *c = SimCq::from(cq);
    SimContext::from(cq->context)->events().forget(cq);
    if (c->channel() != nullptr) {
        c->channel()->forget(c);
        --c->channel()->ibv()->refcnt;
    }
    delete c;
    return 0;
}

int ibv_get_cq_event(ibv_comp_channel *channel, ibv_cq **cq, void **cq_context) {
    SimCq *c = CompChannel::from(channel)->get();
    if (c == nullptr) {
        return -1;
    }
    *cq = c->ibv();
    *cq_context = c->ibv()->cq_context;
    return 0;
}

void ibv_ack_cq_events(ibv_cq *cq, unsigned int nevents) {
    pthread_mutex_lock(&cq->mutex);
    cq->comp_events_completed += nevents;
    pthread_cond_signal(&cq->cond);
    pthread_mutex_unlock(&cq->mutex);
}

}  // extern "C"

namespace tensorlane::simhca::ops {

int pollCq(ibv_cq *cq, int n, ibv_wc *wc) {
    return SimCq::from(cq)->poll(n, wc);
}

int reqNotifyCq(ibv_cq *cq, int solicited_only) {
    return SimCq::from(cq)->arm(solicited_only != 0);
}

ibv_cq_ex *createCqEx(ibv_context *ctx, ibv_cq_init_attr_ex *attr) {
    // Completion timestamps and the other extended fields read as zero; asking for them is
    // allowed (they are "not supported" values, not errors, in rxe too).
    ibv_cq_ex *cq = createCq(ctx, static_cast<int>(attr->cqe), attr->cq_context, attr->channel,
                             static_cast<int>(attr->comp_vector), attr->wc_flags);
    if (cq != nullptr && attr->channel != nullptr) {
        ++attr->channel->refcnt;
    }
    return cq;
}

}  // namespace tensorlane::simhca::ops
