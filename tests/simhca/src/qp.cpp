#include "qp.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "completer.hpp"
#include "context.hpp"
#include "cq.hpp"
#include "device.hpp"
#include "engine.hpp"
#include "log.hpp"
#include "psn.hpp"
#include "qp_state_table.hpp"
#include "requester.hpp"
#include "responder.hpp"

namespace tensorlane::simhca {

int64_t nowNs() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

SimQp::SimQp(SimContext *ctx, const ibv_qp_init_attr_ex &attr, uint32_t qpn, Engine *engine)
    : ctx_(ctx),
      engine_(engine),
      qpn_(qpn),
      send_cq_(SimCq::from(attr.send_cq)),
      recv_cq_(SimCq::from(attr.recv_cq)) {
    handle_.self = this;
    ibv_qp &q = handle_.ibv.qp_base;
    q.context = ctx->ibv();
    q.qp_context = attr.qp_context;
    q.pd = attr.pd;
    q.send_cq = attr.send_cq;
    q.recv_cq = attr.recv_cq;
    q.srq = nullptr;
    q.handle = qpn;
    q.qp_num = qpn;
    q.state = IBV_QPS_RESET;
    q.qp_type = IBV_QPT_RC;
    pthread_mutex_init(&q.mutex, nullptr);
    pthread_cond_init(&q.cond, nullptr);
    cap_ = attr.cap;
    cap_.max_send_wr = std::max<uint32_t>(cap_.max_send_wr, 1);
    cap_.max_recv_wr = std::max<uint32_t>(cap_.max_recv_wr, 1);
    cap_.max_send_sge = std::max<uint32_t>(cap_.max_send_sge, 1);
    cap_.max_recv_sge = std::max<uint32_t>(cap_.max_recv_sge, 1);
    sq_sig_all_ = attr.sq_sig_all != 0;
    sq_.init(cap_.max_send_wr, cap_.max_send_sge, cap_.max_inline_data);
    rq_.init(cap_.max_recv_wr, cap_.max_recv_sge, 0);
    attr_.qp_state = IBV_QPS_RESET;
    attr_.port_num = 1;
    counters_ = ctx->device().counters(1);
    handle_.ibv.comp_mask = 0;
    installQpExOps(&handle_.ibv);
}

SimQp::~SimQp() {
    pthread_cond_destroy(&handle_.ibv.qp_base.cond);
    pthread_mutex_destroy(&handle_.ibv.qp_base.mutex);
}

SimDevice &SimQp::device() const {
    return ctx_->device();
}

bool SimQp::portActive() const {
    return ctx_->device().portActive(attr_.port_num);
}

void SimQp::postAsyncEvent(ibv_event_type type) {
    ibv_async_event ev{};
    ev.element.qp = ibv();
    ev.event_type = type;
    ctx_->events().push(ev);
}

void SimQp::updateDeadlineLocked() {
    int64_t d = 0;
    for (int64_t t : {req_.timer_ns, req_.rnr_wait_ns}) {
        if (t != 0 && (d == 0 || t < d)) {
            d = t;
        }
    }
    deadline_.store(d, std::memory_order_relaxed);
    if (d != 0) {
        engine_->wakeFor(d);
    }
}

int SimQp::checkAttrLocked(const ibv_qp_attr &attr, int mask, ibv_qp_state next) {
    const DeviceInfo info = ctx_->device().info();
    const uint8_t port = (mask & IBV_QP_PORT) ? attr.port_num : attr_.port_num;
    if ((mask & IBV_QP_PORT) && (attr.port_num < 1 || attr.port_num > info.ports.size())) {
        return EINVAL;  // rdma_is_port_valid()
    }
    if (mask & IBV_QP_ALT_PATH) {
        return EINVAL;  // _ib_modify_qp(): alternate paths are banned in RoCE mode
    }
    if ((mask & IBV_QP_PKEY_INDEX) && attr.pkey_index != 0) {
        return EINVAL;  // one P_Key table entry (0xffff), as RoCE ports have
    }
    if (mask & IBV_QP_ACCESS_FLAGS) {
        // rxe: RXE_ACCESS_SUPPORTED_QP
        const unsigned supported = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
        if (attr.qp_access_flags & ~supported) {
            return EINVAL;
        }
    }
    if (mask & IBV_QP_AV) {
        const ibv_ah_attr &ah = attr.ah_attr;
        // rdma_check_ah_attr(): RoCE address vectors must carry a GRH.
        if (!ah.is_global || ah.port_num < 1 || ah.port_num > info.ports.size()) {
            return EINVAL;
        }
        const PortInfo &p = info.ports[ah.port_num - 1];
        if (ah.grh.sgid_index >= p.gids.size() || !p.gids[ah.grh.sgid_index].valid) {
            return EINVAL;  // rdma_get_gid_attr() finds no such entry
        }
        GidEntry dgid;
        dgid.gid = ah.grh.dgid;
        dgid.valid = true;
        if (!p.gids[ah.grh.sgid_index].ipv4() || !dgid.ipv4()) {
            log(LogLevel::kError,
                "QP 0x%x: only IPv4-mapped RoCE v2 GIDs are simulated (sgid index %u)", qpn_,
                ah.grh.sgid_index);
            return EINVAL;
        }
    }
    if (mask & IBV_QP_PATH_MTU) {
        if (attr.path_mtu < IBV_MTU_256 || attr.path_mtu > IBV_MTU_4096 || port < 1 ||
            port > info.ports.size() || attr.path_mtu > info.ports[port - 1].active_mtu) {
            return EINVAL;  // rxe_qp_chk_attr(): path MTU above what the port carries
        }
    }
    if ((mask & IBV_QP_TIMEOUT) && attr.timeout > 31) {
        return EINVAL;  // rxe_qp_chk_attr()
    }
    if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > kMaxRdAtomic) {
        return EINVAL;
    }
    if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > kMaxRdAtomic) {
        return EINVAL;
    }
    (void)next;
    return 0;
}

int SimQp::openPathLocked() {
    const DeviceInfo info = ctx_->device().info();
    const ibv_ah_attr &ah = attr_.ah_attr;
    const PortInfo &p = info.ports[ah.port_num - 1];
    GidEntry dgid;
    dgid.gid = ah.grh.dgid;
    dgid.valid = true;
    src_ip_ = *p.gids[ah.grh.sgid_index].ipv4();
    dst_ip_ = *dgid.ipv4();
    // A host-wide traffic class (tc/<port>/traffic_class) replaces the GRH's, as on mlx5.
    const uint8_t tclass =
        p.tclass_override >= 0 ? static_cast<uint8_t>(p.tclass_override) : ah.grh.traffic_class;
    const int err = tx_.open(src_ip_, roceSourcePort(qpn_), dst_ip_, tclass, ah.grh.hop_limit);
    if (err != 0) {
        log(LogLevel::kError, "QP 0x%x: cannot open its UDP socket: %s", qpn_, strerror(err));
        return err;
    }
    counters_ = ctx_->device().counters(ah.port_num);
    return 0;
}

int SimQp::modify(const ibv_qp_attr &attr, int mask) {
    // The engine's QP map is changed outside the QP lock: the engine takes the map before the
    // QP (lock order in qp.hpp).
    std::unique_lock lock(mutex_);
    const ibv_qp_state before = state_;
    const int err = modifyLocked(attr, mask);
    const ibv_qp_state after = state_;
    const uint32_t local_ip = src_ip_;
    lock.unlock();
    if (err == 0 && before == IBV_QPS_INIT && after == IBV_QPS_RTR) {
        engine_->bindQp(this, local_ip);
    } else if (err == 0 && after == IBV_QPS_RESET) {
        engine_->unbindQp(this);
    }
    return err;
}

int SimQp::modifyLocked(const ibv_qp_attr &attr, int mask) {
    // ib_uverbs_modify_qp(): states beyond ERR are rejected before the table is consulted.
    if (((mask & IBV_QP_STATE) && (attr.qp_state < 0 || attr.qp_state > IBV_QPS_ERR)) ||
        ((mask & IBV_QP_CUR_STATE) && (attr.cur_qp_state < 0 || attr.cur_qp_state > IBV_QPS_ERR))) {
        return EINVAL;
    }
    const ibv_qp_state cur = (mask & IBV_QP_CUR_STATE) ? attr.cur_qp_state : state_;
    if (cur != state_) {
        return EINVAL;
    }
    const ibv_qp_state next = (mask & IBV_QP_STATE) ? attr.qp_state : cur;
    if (!modifyQpIsOk(cur, next, mask)) {
        return EINVAL;
    }
    if (const int err = checkAttrLocked(attr, mask, next); err != 0) {
        return err;
    }
    if (mask & IBV_QP_PORT) {
        attr_.port_num = attr.port_num;
        counters_ = ctx_->device().counters(attr.port_num);
    }
    if (mask & IBV_QP_PKEY_INDEX) {
        attr_.pkey_index = attr.pkey_index;
    }
    if (mask & IBV_QP_ACCESS_FLAGS) {
        attr_.qp_access_flags = attr.qp_access_flags;
    }
    if (mask & IBV_QP_AV) {
        attr_.ah_attr = attr.ah_attr;
    }
    if (mask & IBV_QP_PATH_MTU) {
        attr_.path_mtu = attr.path_mtu;
        mtu_bytes_ = static_cast<uint32_t>(mtuBytes(attr.path_mtu));
    }
    if (mask & IBV_QP_DEST_QPN) {
        attr_.dest_qp_num = attr.dest_qp_num & kQpnMask;
    }
    if (mask & IBV_QP_RQ_PSN) {
        attr_.rq_psn = attr.rq_psn & kPsnMask;  // _ib_modify_qp() masks to 24 bits
    }
    if (mask & IBV_QP_SQ_PSN) {
        attr_.sq_psn = attr.sq_psn & kPsnMask;
    }
    if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) {
        attr_.max_dest_rd_atomic = attr.max_dest_rd_atomic;
    }
    if (mask & IBV_QP_MAX_QP_RD_ATOMIC) {
        attr_.max_rd_atomic = attr.max_rd_atomic;
    }
    if (mask & IBV_QP_MIN_RNR_TIMER) {
        attr_.min_rnr_timer = attr.min_rnr_timer & 0x1f;
    }
    if (mask & IBV_QP_TIMEOUT) {
        attr_.timeout = attr.timeout;
    }
    if (mask & IBV_QP_RETRY_CNT) {
        attr_.retry_cnt = attr.retry_cnt & 7;  // a 3-bit field of the QP context
    }
    if (mask & IBV_QP_RNR_RETRY) {
        attr_.rnr_retry = attr.rnr_retry & 7;
    }
    if (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) {
        attr_.en_sqd_async_notify = attr.en_sqd_async_notify;
    }
    const ibv_qp_state prev = state_;
    switch (next) {
        case IBV_QPS_RESET:
            resetLocked();
            break;
        case IBV_QPS_RTR:
            if (prev == IBV_QPS_INIT) {
                resp_ = ResponderState{};
                resp_.epsn = attr_.rq_psn;
                if (const int err = openPathLocked(); err != 0) {
                    return err;
                }
            }
            break;
        case IBV_QPS_RTS:
            if (prev == IBV_QPS_RTR) {
                req_ = RequesterState{};
                req_.next = req_.started = sq_.head();
                req_.next_psn = req_.una = req_.max_psn_sent = attr_.sq_psn;
                req_.retry_left = attr_.retry_cnt;
                req_.rnr_left = attr_.rnr_retry;
            }
            break;
        case IBV_QPS_ERR:
            state_ = IBV_QPS_ERR;
            flushLocked();
            break;
        default:
            break;
    }
    state_ = next;
    attr_.qp_state = next;
    handle_.ibv.qp_base.state = next;
    if (next == IBV_QPS_RTS) {
        Requester::push(*this);
    }
    if (next == IBV_QPS_SQD && attr_.en_sqd_async_notify) {
        postAsyncEvent(IBV_EVENT_SQ_DRAINED);
    }
    return 0;
}

int SimQp::query(ibv_qp_attr &attr, int, ibv_qp_init_attr &init) {
    std::lock_guard lock(mutex_);
    attr = attr_;
    attr.qp_state = state_;
    attr.cur_qp_state = state_;
    attr.cap = cap_;
    attr.path_mig_state = IBV_MIG_MIGRATED;
    attr.sq_draining = 0;
    init = ibv_qp_init_attr{};
    init.qp_context = handle_.ibv.qp_base.qp_context;
    init.send_cq = send_cq_->ibv();
    init.recv_cq = recv_cq_->ibv();
    init.cap = cap_;
    init.qp_type = IBV_QPT_RC;
    init.sq_sig_all = sq_sig_all_ ? 1 : 0;
    return 0;
}

void SimQp::resetLocked() {
    // Modify to RESET discards every WQE without completions (IB spec 10.3.1.1).
    sq_.clear();
    rq_.clear();
    req_ = RequesterState{};
    resp_.op = ResponderState::Op::kNone;
    resp_.recv_taken = false;
    resp_.ack_pending = false;
    dst_ip_ = 0;
    deadline_.store(0, std::memory_order_relaxed);
}

bool SimQp::completeSendLocked(SendWqe &w, ibv_wc_status status) {
    if (status == IBV_WC_SUCCESS && !w.signaled && !sq_sig_all_) {
        return true;  // unsignalled: no completion (ibv_post_send(3), IBV_SEND_SIGNALED)
    }
    ibv_wc wc{};
    wc.wr_id = w.wr_id;
    wc.status = status;
    switch (w.opcode) {
        case IBV_WR_RDMA_WRITE:
        case IBV_WR_RDMA_WRITE_WITH_IMM:
            wc.opcode = IBV_WC_RDMA_WRITE;
            break;
        case IBV_WR_RDMA_READ:
            wc.opcode = IBV_WC_RDMA_READ;
            wc.byte_len = w.length;
            break;
        default:
            wc.opcode = IBV_WC_SEND;
            break;
    }
    wc.qp_num = qpn_;
    if (status == IBV_WC_WR_FLUSH_ERR) {
        counters().add(Counter::kReqCqeFlushError);
    } else if (status != IBV_WC_SUCCESS) {
        counters().add(Counter::kReqCqeError);
    }
    return send_cq_->push(wc, false);
}

bool SimQp::completeRecvLocked(ibv_wc_opcode opcode, ibv_wc_status status, uint32_t byte_len,
                               bool with_imm, uint32_t imm_host, bool solicited) {
    if (rq_.empty()) {
        return true;
    }
    RecvWqe &w = rq_.at(rq_.head());
    ibv_wc wc{};
    wc.wr_id = w.wr_id;
    wc.status = status;
    wc.opcode = opcode;
    wc.byte_len = byte_len;
    wc.qp_num = qpn_;
    wc.src_qp = attr_.dest_qp_num;
    wc.sl = attr_.ah_attr.sl;
    if (with_imm) {
        wc.wc_flags |= IBV_WC_WITH_IMM;
        wc.imm_data = htonl(imm_host);  // ibv_wc::imm_data is in network order
    }
    rq_.pop();
    resp_.recv_taken = false;
    resp_.recv_offset = 0;
    if (status == IBV_WC_WR_FLUSH_ERR) {
        counters().add(Counter::kRespCqeFlushError);
    } else if (status != IBV_WC_SUCCESS) {
        counters().add(Counter::kRespCqeError);
    }
    return recv_cq_->push(wc, solicited);
}

void SimQp::flushLocked() {
    // IB spec 10.3.1.2 / 11.4.1.1: in ERR every outstanding and newly posted WR completes with
    // IBV_WC_WR_FLUSH_ERR, signalled or not.
    while (!sq_.empty()) {
        SendWqe &w = sq_.at(sq_.head());
        if (!w.done) {
            (void)completeSendLocked(w, IBV_WC_WR_FLUSH_ERR);
        }
        sq_.pop();
    }
    while (!rq_.empty()) {
        (void)completeRecvLocked(IBV_WC_RECV, IBV_WC_WR_FLUSH_ERR, 0, false, 0, false);
    }
    req_.next = req_.started = sq_.head();
    req_.next_pkt = 0;
    req_.timer_ns = 0;
    req_.rnr_wait_ns = 0;
    deadline_.store(0, std::memory_order_relaxed);
}

void SimQp::enterErrorLocked() {
    state_ = IBV_QPS_ERR;
    attr_.qp_state = IBV_QPS_ERR;
    handle_.ibv.qp_base.state = IBV_QPS_ERR;
    flushLocked();
}

void SimQp::fatalLocked() {
    enterErrorLocked();
    postAsyncEvent(IBV_EVENT_QP_FATAL);
}

int SimQp::postSend(ibv_send_wr *wr, ibv_send_wr **bad) {
    std::lock_guard lock(mutex_);
    // rxe_post_send(): a send queue that is not ready rejects the post outright.
    if (state_ == IBV_QPS_RESET || state_ == IBV_QPS_INIT || state_ == IBV_QPS_RTR) {
        *bad = wr;
        return EINVAL;
    }
    for (; wr != nullptr; wr = wr->next) {
        if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > cap_.max_send_sge) {
            *bad = wr;
            return EINVAL;
        }
        switch (wr->opcode) {
            case IBV_WR_SEND:
            case IBV_WR_SEND_WITH_IMM:
            case IBV_WR_RDMA_WRITE:
            case IBV_WR_RDMA_WRITE_WITH_IMM:
            case IBV_WR_RDMA_READ:
                break;
            default:
                *bad = wr;  // atomics, memory windows, invalidation: not modelled
                return EINVAL;
        }
        uint64_t total = 0;
        for (int i = 0; i < wr->num_sge; ++i) {
            total += wr->sg_list[i].length;
        }
        const bool is_inline = (wr->send_flags & IBV_SEND_INLINE) != 0;
        if (total > (1u << 31) ||
            (is_inline && (total > cap_.max_inline_data || wr->opcode == IBV_WR_RDMA_READ))) {
            *bad = wr;
            return EINVAL;
        }
        if (sq_.full()) {
            *bad = wr;
            return ENOMEM;  // as mlx5: the send queue is full
        }
        SendWqe &w = sq_.push();
        w.wr_id = wr->wr_id;
        w.opcode = wr->opcode;
        w.imm_be = wr->imm_data;
        w.remote_addr = wr->wr.rdma.remote_addr;
        w.rkey = wr->wr.rdma.rkey;
        w.length = static_cast<uint32_t>(total);
        w.signaled = (wr->send_flags & IBV_SEND_SIGNALED) != 0;
        w.solicited = (wr->send_flags & IBV_SEND_SOLICITED) != 0;
        w.fence = (wr->send_flags & IBV_SEND_FENCE) != 0;
        w.is_inline = is_inline;
        w.num_sge = static_cast<uint32_t>(wr->num_sge);
        w.done = false;
        w.npackets = 0;
        w.read_next = 0;
        uint32_t at = 0;
        for (int i = 0; i < wr->num_sge; ++i) {
            const ibv_sge &sge = wr->sg_list[i];
            w.sges[i] = Segment{sge.addr, sge.length, sge.lkey};
            if (is_inline) {
                // Inline data is copied at post time; the buffer may be reused at once.
                std::memcpy(w.inline_data + at, reinterpret_cast<const void *>(sge.addr),
                            sge.length);
                at += sge.length;
            }
        }
    }
    if (state_ == IBV_QPS_ERR) {
        flushLocked();
    } else {
        Requester::push(*this);
    }
    return 0;
}

int SimQp::postRecv(ibv_recv_wr *wr, ibv_recv_wr **bad) {
    std::lock_guard lock(mutex_);
    if (state_ == IBV_QPS_RESET) {
        *bad = wr;
        return EINVAL;
    }
    for (; wr != nullptr; wr = wr->next) {
        if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > cap_.max_recv_sge) {
            *bad = wr;
            return EINVAL;
        }
        if (rq_.full()) {
            *bad = wr;
            return ENOMEM;
        }
        RecvWqe &w = rq_.push();
        w.wr_id = wr->wr_id;
        w.num_sge = static_cast<uint32_t>(wr->num_sge);
        w.capacity = 0;
        for (int i = 0; i < wr->num_sge; ++i) {
            w.sges[i] = Segment{wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey};
            w.capacity += wr->sg_list[i].length;
        }
    }
    if (state_ == IBV_QPS_ERR) {
        flushLocked();
    }
    return 0;
}

void SimQp::receive(const Packet &pkt, uint32_t src_ip, uint16_t) {
    std::lock_guard lock(mutex_);
    if (src_ip != dst_ip_) {
        counters().add(Counter::kSimRxUnknownQp);
        return;  // not from this QP's peer (an RC QP is connected to one remote QP)
    }
    if (pkt.info->flags & kIsResponse) {
        Completer::receive(*this, pkt);
    } else {
        Responder::receive(*this, pkt);
    }
    if (tx_.pending() > 0) {
        tx_.flush();
    }
}

int64_t SimQp::onTimer(int64_t now) {
    std::lock_guard lock(mutex_);
    Completer::onTimer(*this, now);
    return deadline();
}

void SimQp::flushAck() {
    std::lock_guard lock(mutex_);
    Responder::flushAck(*this);
}

}  // namespace tensorlane::simhca
