// Owners of rdma-core objects: move-only unique_ptrs whose deleters are the ibv_destroy/dealloc
// calls, so a member list declared in creation order tears down in the reverse order rdma-core
// requires (QP -> CQ -> MR -> PD -> context; libibverbs/examples/rc_pingpong.c).
#pragma once

#include <infiniband/verbs.h>

#include <memory>

namespace tensorlane::sidecar::verbs_detail {

template <class T, auto Fn>
struct Deleter {
    void operator()(T *p) const {
        if (p != nullptr) {
            (void)Fn(p);
        }
    }
};

using ContextPtr = std::unique_ptr<ibv_context, Deleter<ibv_context, &ibv_close_device>>;
using PdPtr = std::unique_ptr<ibv_pd, Deleter<ibv_pd, &ibv_dealloc_pd>>;
using CompChannelPtr =
    std::unique_ptr<ibv_comp_channel, Deleter<ibv_comp_channel, &ibv_destroy_comp_channel>>;
using CqPtr = std::unique_ptr<ibv_cq, Deleter<ibv_cq, &ibv_destroy_cq>>;
using QpPtr = std::unique_ptr<ibv_qp, Deleter<ibv_qp, &ibv_destroy_qp>>;
using MrPtr = std::unique_ptr<ibv_mr, Deleter<ibv_mr, &ibv_dereg_mr>>;

}  // namespace tensorlane::sidecar::verbs_detail
