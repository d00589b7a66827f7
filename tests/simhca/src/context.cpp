#include "context.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include "device.hpp"
#include "verbs_ops.hpp"

namespace tensorlane::simhca {

SimContext::SimContext(SimDevice *dev)
    : device_(dev), cmd_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    handle_.self = this;
    verbs_context &v = handle_.vctx;
    ibv_context &c = v.context;
    c.device = dev->ibv();
    c.cmd_fd = cmd_fd_;  // a real fd, never written: this simulator has no kernel commands
    c.async_fd = events_.fd();
    c.num_comp_vectors = 1;
    pthread_mutex_init(&c.mutex, nullptr);
    // verbs.h: verbs_get_ctx() accepts a context only with this marker, and verbs_get_ctx_op()
    // checks that sz covers the member it calls.
    c.abi_compat = __VERBS_ABI_IS_EXTENDED;
    v.sz = sizeof(verbs_context);
    c.ops.poll_cq = ops::pollCq;
    c.ops.req_notify_cq = ops::reqNotifyCq;
    c.ops.post_send = ops::postSend;
    c.ops.post_recv = ops::postRecv;
    c.ops.post_srq_recv = ops::postSrqRecv;
    c.ops.alloc_mw = ops::allocMw;
    c.ops.bind_mw = ops::bindMw;
    c.ops.dealloc_mw = ops::deallocMw;
    v.query_port = ops::queryPort;
    v.query_device_ex = ops::queryDeviceEx;
    v.create_cq_ex = ops::createCqEx;
    v.create_qp_ex = ops::createQpEx;
    v.query_rt_values = ops::queryRtValues;
    dev->addContext(this);
}

SimContext::~SimContext() {
    device_->removeContext(this);
    pthread_mutex_destroy(&handle_.vctx.context.mutex);
    if (cmd_fd_ >= 0) {
        ::close(cmd_fd_);
    }
}

}  // namespace tensorlane::simhca
