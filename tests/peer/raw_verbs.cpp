#include "raw_verbs.hpp"

#include <arpa/inet.h>

#include <chrono>
#include <cstring>

namespace tensorlane::peertest {

using sidecar::Status;

RawVerbsEnd::~RawVerbsEnd() {
    qps_.clear();
    cq_.reset();
    mr_.reset();
    pd_.reset();
    ctx_.reset();
}

bool RawVerbsEnd::open(int index, uint32_t qps, std::string *why) {
    const std::string name = "sim" + std::to_string(index);
    int n = 0;
    ibv_device **list = ibv_get_device_list(&n);
    for (int i = 0; list != nullptr && i < n; ++i) {
        if (name == ibv_get_device_name(list[i])) {
            ctx_.reset(ibv_open_device(list[i]));
        }
    }
    if (list != nullptr) {
        ibv_free_device_list(list);
    }
    if (!ctx_) {
        *why = "cannot open " + name;
        return false;
    }
    params_.sgid_index = 3;  // mksysfs.sh's default: the IPv4 RoCE v2 GID
    params_.path_mtu = IBV_MTU_4096;
    params_.timeout = 14;
    params_.retry_cnt = 3;
    params_.max_send_wr = 64;
    params_.max_recv_wr = 1;
    ibv_gid g{};
    if (ibv_query_gid(ctx_.get(), 1, params_.sgid_index, &g) != 0) {
        *why = "ibv_query_gid failed";
        return false;
    }
    std::memcpy(gid_.data(), g.raw, 16);
    pd_.reset(ibv_alloc_pd(ctx_.get()));
    cq_.reset(ibv_create_cq(ctx_.get(), 256, nullptr, nullptr, 0));
    buf_.assign(1u << 20, 0x6b);
    if (!pd_ || !cq_) {
        *why = "ibv_alloc_pd / ibv_create_cq failed";
        return false;
    }
    mr_.reset(ibv_reg_mr(pd_.get(), buf_.data(), buf_.size(), IBV_ACCESS_LOCAL_WRITE));
    if (!mr_) {
        *why = "ibv_reg_mr failed";
        return false;
    }
    for (uint32_t i = 0; i < qps; ++i) {
        sidecar::verbs_detail::QpPtr qp;
        if (Status s = sidecar::createRcQp(pd_.get(), cq_.get(), cq_.get(), params_, &qp);
            !s.isOk()) {
            *why = s.message();
            return false;
        }
        if (Status s = sidecar::qpToInit(qp.get(), params_, 0); !s.isOk()) {
            *why = s.message();
            return false;
        }
        local_.push_back({qp->qp_num, sidecar::randomPsn()});
        qps_.push_back(std::move(qp));
    }
    return true;
}

sidecar::VerbsBlob RawVerbsEnd::blob() const {
    sidecar::VerbsBlob b;
    b.gid = gid_;
    b.mtu_bytes = 4096;
    b.traffic_class = 106;
    b.sl = 3;
    b.qps = local_;
    return b;
}

bool RawVerbsEnd::connect(const sidecar::VerbsBlob &receiver, std::string *why) {
    if (receiver.qps.size() != qps_.size()) {
        *why = "the receiver made " + std::to_string(receiver.qps.size()) + " QPs";
        return false;
    }
    remote_ = receiver;
    for (size_t i = 0; i < qps_.size(); ++i) {
        if (Status s = sidecar::qpToRtr(qps_[i].get(), params_, receiver.qps[i], receiver.gid);
            !s.isOk()) {
            *why = s.message();
            return false;
        }
        if (Status s = sidecar::qpToRts(qps_[i].get(), params_, local_[i].psn); !s.isOk()) {
            *why = s.message();
            return false;
        }
    }
    return true;
}

bool RawVerbsEnd::post(uint32_t qp, ibv_wr_opcode opcode, uint64_t local_offset, uint32_t len,
                       uint64_t remote_addr, uint32_t rkey, uint32_t wire_imm) {
    if (local_offset + len > buf_.size() || qp >= qps_.size()) {
        return false;
    }
    ibv_sge sge{reinterpret_cast<uint64_t>(buf_.data()) + local_offset, len, mr_->lkey};
    ibv_send_wr wr{};
    wr.wr_id = static_cast<uint64_t>(opcode);
    wr.sg_list = &sge;
    wr.num_sge = len != 0 ? 1 : 0;
    wr.opcode = opcode;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(wire_imm);
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr *bad = nullptr;
    return ibv_post_send(qps_[qp].get(), &wr, &bad) == 0;
}

bool RawVerbsEnd::postDescriptor(uint32_t qp, const sidecar::WriteDescriptor &d) {
    std::memcpy(buf_.data(), &d, sizeof d);
    return post(qp, IBV_WR_RDMA_WRITE, 0, sizeof d,
                remote_.ring_addr + (d.seq % remote_.ring_slots) * sizeof(sidecar::WriteDescriptor),
                remote_.ring_rkey, 0);
}

bool RawVerbsEnd::postMessage(uint32_t qp, const sidecar::WriteDescriptor &d, uint32_t wire_imm) {
    std::memcpy(buf_.data(), &d, sizeof d);
    return post(qp, IBV_WR_RDMA_WRITE_WITH_IMM, 0, sizeof d,
                remote_.ring_addr + (d.seq % remote_.ring_slots) * sizeof(sidecar::WriteDescriptor),
                remote_.ring_rkey, wire_imm);
}

bool RawVerbsEnd::postData(uint32_t qp, uint64_t addr, uint32_t rkey, uint32_t len,
                           uint32_t wire_imm) {
    return post(qp, IBV_WR_RDMA_WRITE_WITH_IMM, 4096, len, addr, rkey, wire_imm);
}

bool RawVerbsEnd::postRead(uint32_t qp, uint64_t addr, uint32_t rkey, uint32_t len) {
    return post(qp, IBV_WR_RDMA_READ, 4096, len, addr, rkey, 0);
}

int RawVerbsEnd::nextCompletion(int timeout_ms) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < end) {
        ibv_wc wc{};
        if (ibv_poll_cq(cq_.get(), 1, &wc) == 1) {
            return wc.status;
        }
    }
    return -1;
}

}  // namespace tensorlane::peertest
