#include "transport/verbs/gdr_flush.hpp"

#include <cerrno>
#include <cstring>

namespace tensorlane::sidecar {

Status GdrFlusher::create(ibv_pd *pd, ibv_cq *cq, const QpParams &params,
                          const std::array<uint8_t, 16> &gid) {
    QpParams p = params;
    p.max_send_wr = 16;
    p.max_recv_wr = 1;
    sink_.assign(64, 0);
    ibv_mr *mr =
        ibv_reg_mr(pd, sink_.data(), sink_.size(), static_cast<int>(IBV_ACCESS_LOCAL_WRITE));
    if (mr == nullptr) {
        return {Code::kInternal, std::string("ibv_reg_mr (flush buffer): ") + std::strerror(errno)};
    }
    sink_mr_.reset(mr);
    verbs_detail::QpPtr req, resp;
    if (Status s = createRcQp(pd, cq, cq, p, &req); !s.isOk()) {
        return s;
    }
    if (Status s = createRcQp(pd, cq, cq, p, &resp); !s.isOk()) {
        return s;
    }
    if (Status s = qpToInit(req.get(), p, 0); !s.isOk()) {
        return s;
    }
    if (Status s = qpToInit(resp.get(), p, IBV_ACCESS_REMOTE_READ); !s.isOk()) {
        return s;
    }
    const QpEndpoint a{req->qp_num, randomPsn()}, b{resp->qp_num, randomPsn()};
    // RTR needs max_dest_rd_atomic >= 1 on the responder and RTS max_rd_atomic >= 1 on the
    // requester: qp.cpp sets both to 1 for every QP.
    if (Status s = qpToRtr(req.get(), p, b, gid); !s.isOk()) {
        return s;
    }
    if (Status s = qpToRtr(resp.get(), p, a, gid); !s.isOk()) {
        return s;
    }
    if (Status s = qpToRts(req.get(), p, a.psn); !s.isOk()) {
        return s;
    }
    if (Status s = qpToRts(resp.get(), p, b.psn); !s.isOk()) {
        return s;
    }
    requester_ = std::move(req);
    responder_ = std::move(resp);
    return Status::ok();
}

bool GdrFlusher::post(uint64_t addr, uint32_t rkey, uint32_t bytes, uint64_t wr_id) {
    ibv_sge sge{reinterpret_cast<uint64_t>(sink_.data()), bytes < 1 ? 1 : (bytes > 8 ? 8 : bytes),
                sink_mr_->lkey};
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = addr;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr *bad = nullptr;
    if (ibv_post_send(requester_.get(), &wr, &bad) != 0) {
        return false;
    }
    ++posted_;
    return true;
}

bool GdrFlusher::owns(const ibv_wc &wc) const {
    return requester_ != nullptr && wc.qp_num == requester_->qp_num;
}

}  // namespace tensorlane::sidecar
