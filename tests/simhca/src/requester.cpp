#include "requester.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "completer.hpp"
#include "headers.hpp"
#include "mr_table.hpp"
#include "opcode.hpp"
#include "psn.hpp"
#include "qp.hpp"
#include "sge_copy.hpp"

namespace tensorlane::simhca {
namespace {

// The opcode of packet k of n of a WQE (IB spec 9.4: FIRST/MIDDLE/LAST, or ONLY).
Opcode opcodeFor(const SendWqe &w, uint32_t k) {
    const bool first = k == 0;
    const bool last = k + 1 == w.npackets;
    const bool imm = w.opcode == IBV_WR_SEND_WITH_IMM || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    if (w.opcode == IBV_WR_RDMA_WRITE || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
        if (first && last) {
            return imm ? Opcode::kWriteOnlyWithImm : Opcode::kWriteOnly;
        }
        if (first) {
            return Opcode::kWriteFirst;
        }
        return last ? (imm ? Opcode::kWriteLastWithImm : Opcode::kWriteLast) : Opcode::kWriteMiddle;
    }
    if (first && last) {
        return imm ? Opcode::kSendOnlyWithImm : Opcode::kSendOnly;
    }
    if (first) {
        return Opcode::kSendFirst;
    }
    return last ? (imm ? Opcode::kSendLastWithImm : Opcode::kSendLast) : Opcode::kSendMiddle;
}

}  // namespace

// Incomplete READs ahead of position pos (the fence waits for them; max_rd_atomic caps them).
uint32_t Requester::readsBefore(SimQp &qp, uint64_t pos) {
    WqRing<SendWqe> &sq = qp.sq_;
    uint32_t n = 0;
    for (uint64_t i = sq.head(); i < pos; ++i) {
        const SendWqe &w = sq.at(i);
        if (w.opcode == IBV_WR_RDMA_READ && !w.done) {
            ++n;
        }
    }
    return n;
}

void Requester::restartTimer(SimQp &qp) {
    RequesterState &r = qp.req_;
    if (qp.attr_.timeout == 0 || psnDiff(r.next_psn, r.una) <= 0) {
        r.timer_ns = 0;  // IB spec 9.7.6.1.3: a timeout value of 0 means wait forever
    } else {
        r.timer_ns = nowNs() + (int64_t{4096} << qp.attr_.timeout);
    }
    qp.updateDeadlineLocked();
}

void Requester::rewind(SimQp &qp, uint32_t psn) {
    RequesterState &r = qp.req_;
    for (uint64_t pos = qp.sq_.head(); pos < r.started && pos < qp.sq_.tail(); ++pos) {
        SendWqe &w = qp.sq_.at(pos);
        const int32_t off = psnDiff(psn, w.first_psn);
        if (off >= 0 && off < static_cast<int32_t>(w.npackets)) {
            r.next = pos;
            r.next_pkt = static_cast<uint32_t>(off);
            if (w.opcode == IBV_WR_RDMA_READ) {
                // A READ is asked for again from the first response not yet received.
                r.next_pkt = w.read_next;
                psn = psnAdd(w.first_psn, w.read_next);
            }
            r.next_psn = psn;
            return;
        }
    }
    // Past every WQE given PSNs (an ACK for what was sent before a go-back): continue with the
    // first one not yet started.
    r.next = std::max(r.started, qp.sq_.head());
    r.next_pkt = 0;
    r.next_psn = psn;
}

void Requester::push(SimQp &qp) {
    RequesterState &r = qp.req_;
    if (qp.state_ != IBV_QPS_RTS || !qp.tx_.isOpen() || r.rnr_wait_ns != 0) {
        return;
    }
    if (!qp.portActive()) {
        return;  // the link is down: nothing leaves; the transport timer will expire
    }
    std::shared_lock mr_lock(MrTable::instance().mutex());
    bool sent_any = false;
    const bool was_idle = psnDiff(r.next_psn, r.una) <= 0;
    while (r.next < qp.sq_.tail()) {
        SendWqe &w = qp.sq_.at(r.next);
        if (r.next_pkt == 0 || w.opcode == IBV_WR_RDMA_READ) {
            const uint32_t reads = readsBefore(qp, r.next);
            if (w.fence && reads > 0) {
                break;  // IBV_SEND_FENCE: wait for earlier READs to complete
            }
            if (w.opcode == IBV_WR_RDMA_READ &&
                reads >= std::max<uint32_t>(1, qp.attr_.max_rd_atomic)) {
                break;  // max_rd_atomic READs already outstanding (IB spec 9.5: initiator depth)
            }
        }
        if (r.next_pkt == 0) {
            r.started = std::max(r.started, r.next + 1);
            w.first_psn = r.next_psn;
            w.npackets = std::max<uint32_t>(1, (w.length + qp.mtu_bytes_ - 1) / qp.mtu_bytes_);
            w.read_next = 0;
            if (!w.is_inline &&
                !sgesValid(w.sges, w.num_sge, qp.ibv()->pd,
                           w.opcode == IBV_WR_RDMA_READ ? IBV_ACCESS_LOCAL_WRITE : 0)) {
                // IB spec 10.6.3.3 / rxe: a bad L_Key is a local protection error, completed in
                // error, and the QP goes to ERR.
                w.done = true;
                mr_lock.unlock();
                qp.completeSendLocked(w, IBV_WC_LOC_PROT_ERR);
                qp.enterErrorLocked();
                return;
            }
        }
        if (psnDiff(r.next_psn, r.una) >= kSendWindow) {
            break;
        }
        const uint32_t psn = r.next_psn;
        if (w.opcode == IBV_WR_RDMA_READ) {
            const uint64_t off = uint64_t{r.next_pkt} * qp.mtu_bytes_;
            TxPacket &p = qp.tx_.begin(kBthBytes + kRethBytes);
            Bth bth;
            bth.opcode = static_cast<uint8_t>(Opcode::kReadRequest);
            bth.dest_qpn = qp.attr_.dest_qp_num;
            bth.psn = psn;
            bth.ack_req = true;
            writeBth(p.header, bth);
            writeReth(p.header + kBthBytes,
                      Reth{w.remote_addr + off, w.rkey, static_cast<uint32_t>(w.length - off)});
            qp.tx_.finish(p);
            r.next_psn = psnAdd(w.first_psn, w.npackets);
            r.next_pkt = w.npackets;
        } else {
            const uint32_t k = r.next_pkt;
            const uint64_t off = uint64_t{k} * qp.mtu_bytes_;
            const uint32_t len =
                static_cast<uint32_t>(std::min<uint64_t>(qp.mtu_bytes_, w.length - off));
            const Opcode op = opcodeFor(w, k);
            const OpcodeInfo *info = opcodeInfo(static_cast<uint8_t>(op));
            TxPacket &p = qp.tx_.begin(info->header_bytes);
            Bth bth;
            bth.opcode = static_cast<uint8_t>(op);
            bth.dest_qpn = qp.attr_.dest_qp_num;
            bth.psn = psn;
            const bool last = k + 1 == w.npackets;
            bth.solicited = last && w.solicited;
            bth.ack_req = last || (k % kAckReqInterval) == kAckReqInterval - 1;
            writeBth(p.header, bth);
            size_t at = kBthBytes;
            if (info->flags & kHasReth) {
                writeReth(p.header + at, Reth{w.remote_addr, w.rkey, w.length});
                at += kRethBytes;
            }
            if (info->flags & kHasImm) {
                // The immediate goes on the wire as the application gave it: ibv_send_wr's
                // imm_data is already in network order (ibv_post_send(3)).
                std::memcpy(p.header + at, &w.imm_be, kImmBytes);
            }
            bool ok = true;
            if (w.is_inline) {
                qp.tx_.addPayload(p, w.inline_data + off, len);
            } else {
                ok = gatherToPacket(qp.tx_, p, w.sges, w.num_sge, off, len, qp.ibv()->pd);
            }
            if (!ok) {
                // The packet is abandoned unsent; the QP goes to ERR.
                mr_lock.unlock();
                qp.tx_.flush();
                w.done = true;
                qp.completeSendLocked(w, IBV_WC_LOC_PROT_ERR);
                qp.enterErrorLocked();
                return;
            }
            qp.tx_.finish(p);
            r.next_psn = psnAdd(psn, 1);
            ++r.next_pkt;
        }
        sent_any = true;
        qp.counters().add(Counter::kSimTxPackets);
        if (psnDiff(psn, r.max_psn_sent) < 0) {
            qp.counters().add(Counter::kSimTxRetransmits);
        } else {
            r.max_psn_sent = psnAdd(psn, 1);
        }
        if (r.next_pkt >= w.npackets) {
            ++r.next;
            r.next_pkt = 0;
        }
    }
    qp.tx_.flush();
    if (sent_any && (was_idle || r.timer_ns == 0)) {
        restartTimer(qp);
    }
}

}  // namespace tensorlane::simhca
