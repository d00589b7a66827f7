#include "responder.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "engine.hpp"
#include "headers.hpp"
#include "memory_region.hpp"
#include "mr_table.hpp"
#include "opcode.hpp"
#include "packet_parser.hpp"
#include "psn.hpp"
#include "qp.hpp"
#include "sge_copy.hpp"

namespace tensorlane::simhca {
namespace {

// The region an R_Key names, if it belongs to the QP's PD, covers [va, va+len) and grants
// access; the QP must grant it too (IB spec 10.6.3.2 and o9-..: both the QP's and the
// region's access rights are checked). The caller holds the MrTable lock shared.
const MemoryRegion *remoteRegion(SimQp &qp, ibv_pd *pd, int qp_access, uint32_t rkey, uint64_t va,
                                 uint64_t len, int access) {
    if ((qp_access & access) != access) {
        return nullptr;
    }
    const MemoryRegion *mr = MrTable::instance().lookupLocked(rkey);
    if (mr == nullptr || mr->pd() != pd || (mr->access() & access) != access ||
        !mr->contains(va, len)) {
        return nullptr;
    }
    (void)qp;
    return mr;
}

}  // namespace

void Responder::sendAck(SimQp &qp, uint8_t syndrome, uint32_t psn) {
    TxPacket &p = qp.tx_.begin(kBthBytes + kAethBytes);
    Bth bth;
    bth.opcode = static_cast<uint8_t>(Opcode::kAcknowledge);
    bth.dest_qpn = qp.attr_.dest_qp_num;
    bth.psn = psn;
    writeBth(p.header, bth);
    writeAeth(p.header + kBthBytes, Aeth{syndrome, qp.resp_.msn});
    qp.tx_.finish(p);
    qp.tx_.flush();
    qp.counters().add(Counter::kSimTxPackets);
}

void Responder::flushAck(SimQp &qp) {
    ResponderState &s = qp.resp_;
    s.scheduled = false;
    if (!s.ack_pending || !qp.tx_.isOpen()) {
        return;
    }
    s.ack_pending = false;
    sendAck(qp, kAethAck | kAethCreditsInvalid, s.ack_psn);
}

// Answers a READ request with psn; generates its responses (IB spec 9.7.5.2.5: a duplicate
// READ is executed again, from the memory as it is now).
bool Responder::executeRead(SimQp &qp, const Packet &pkt, bool duplicate) {
    const Reth &reth = pkt.reth;
    std::shared_lock mr_lock(MrTable::instance().mutex());
    const MemoryRegion *mr = remoteRegion(qp, qp.ibv()->pd, qp.attr_.qp_access_flags, reth.rkey,
                                          reth.va, reth.dma_len, IBV_ACCESS_REMOTE_READ);
    if (mr == nullptr) {
        return false;
    }
    if (!duplicate) {
        qp.counters().add(Counter::kRxReadRequests);
    }
    const uint32_t mtu = qp.mtu_bytes_;
    const uint32_t n = std::max<uint32_t>(1, (reth.dma_len + mtu - 1) / mtu);
    for (uint32_t k = 0; k < n; ++k) {
        Opcode op = Opcode::kReadResponseMiddle;
        if (n == 1) {
            op = Opcode::kReadResponseOnly;
        } else if (k == 0) {
            op = Opcode::kReadResponseFirst;
        } else if (k + 1 == n) {
            op = Opcode::kReadResponseLast;
        }
        const OpcodeInfo *info = opcodeInfo(static_cast<uint8_t>(op));
        TxPacket &p = qp.tx_.begin(info->header_bytes);
        Bth bth;
        bth.opcode = static_cast<uint8_t>(op);
        bth.dest_qpn = qp.attr_.dest_qp_num;
        bth.psn = psnAdd(pkt.bth.psn, k);
        writeBth(p.header, bth);
        if (info->flags & kHasAeth) {
            writeAeth(p.header + kBthBytes,
                      Aeth{kAethAck | kAethCreditsInvalid, psnAdd(qp.resp_.msn, 1)});
        }
        const uint64_t off = uint64_t{k} * mtu;
        const uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(mtu, reth.dma_len - off));
        if (mr->isHost()) {
            qp.tx_.addPayload(p, mr->hostAddress(reth.va + off), len);
        } else {
            uint8_t *b = qp.tx_.bounce(p, len);
            if (!mr->read(reth.va + off, b, len)) {
                return false;
            }
            qp.tx_.addPayload(p, b, len);
        }
        qp.tx_.finish(p);
        qp.counters().add(Counter::kSimTxPackets);
    }
    qp.tx_.flush();
    return true;
}

// A request that cannot be carried out ends the QP: the NAK goes out, then the QP moves to ERR
// and the application hears of it by an async event (IB spec 9.9.3.1.2, class C errors).
void Responder::failRequest(SimQp &qp, uint8_t syndrome, uint32_t psn, ibv_event_type event) {
    Responder::sendAck(qp, syndrome, psn);
    qp.enterErrorLocked();
    qp.postAsyncEvent(event);
}

void Responder::receive(SimQp &qp, const Packet &pkt) {
    if (qp.state_ != IBV_QPS_RTR && qp.state_ != IBV_QPS_RTS && qp.state_ != IBV_QPS_SQD) {
        return;  // IB spec 10.3.1: a QP in RESET, INIT or ERR drops what arrives
    }
    ResponderState &s = qp.resp_;
    const uint32_t psn = pkt.bth.psn;
    const uint32_t flags = pkt.info->flags;
    const int32_t d = psnDiff(psn, s.epsn);
    if (d > 0) {
        // Ahead of the expected PSN: a packet was lost. One NAK, then silence until the
        // expected PSN arrives (9.7.5.2.2).
        qp.counters().add(Counter::kOutOfSequence);
        if (!s.nak_sent) {
            s.nak_sent = true;
            sendAck(qp, kAethNakSeqErr, s.epsn);
        }
        return;
    }
    if (d < 0) {
        // A duplicate (9.7.5.2.5): not executed again, but acknowledged, since the ACK for it
        // may be what was lost. Duplicate READs are answered again.
        qp.counters().add(Counter::kDuplicateRequest);
        if (flags & kIsRead) {
            if (!executeRead(qp, pkt, true)) {
                failRequest(qp, kAethNakRemoteAccess, psn, IBV_EVENT_QP_ACCESS_ERR);
            }
            return;
        }
        s.ack_pending = true;
        s.ack_psn = psnAdd(s.epsn, kPsnMask);
        if (!s.scheduled) {
            s.scheduled = true;
            qp.engine_->scheduleAck(&qp);
        }
        return;
    }
    s.nak_sent = false;
    // Opcode sequence (9.7.5.2.3 / C9-..): a message in progress continues with MIDDLE or LAST
    // of its own kind; otherwise only FIRST or ONLY may come.
    const bool in_progress = s.op != ResponderState::Op::kNone;
    const bool kind_ok =
        !in_progress ||
        (s.op == ResponderState::Op::kSend ? (flags & kIsSend) != 0 : (flags & kIsWrite) != 0);
    if (in_progress == ((flags & kIsFirst) != 0) || !kind_ok) {
        failRequest(qp, kAethNakInvalidRequest, psn, IBV_EVENT_QP_REQ_ERR);
        return;
    }
    if (flags & kIsRead) {
        if (!executeRead(qp, pkt, false)) {
            qp.counters().add(Counter::kRespRemoteAccessErrors);
            failRequest(qp, kAethNakRemoteAccess, psn, IBV_EVENT_QP_ACCESS_ERR);
            return;
        }
        const uint32_t n =
            std::max<uint32_t>(1, (pkt.reth.dma_len + qp.mtu_bytes_ - 1) / qp.mtu_bytes_);
        s.epsn = psnAdd(s.epsn, n);
        s.msn = psnAdd(s.msn, 1);
        return;
    }
    const uint32_t len = pkt.payload_len;
    const bool last = (flags & kIsLast) != 0;
    if (len > qp.mtu_bytes_ || (!last && len != qp.mtu_bytes_)) {
        // FIRST and MIDDLE carry exactly one path MTU; nothing carries more (9.7.5.2.4).
        failRequest(qp, kAethNakInvalidRequest, psn, IBV_EVENT_QP_REQ_ERR);
        return;
    }
    if ((flags & kConsumesRecv) && !s.recv_taken && qp.rq_.empty()) {
        // No receive WQE: RNR NAK with this QP's min_rnr_timer; the PSN is not consumed and
        // later packets are dropped until the retry arrives (9.7.5.2.8).
        qp.counters().add(Counter::kOutOfBuffer);
        s.nak_sent = true;
        sendAck(qp, static_cast<uint8_t>(kAethRnrNak | (qp.attr_.min_rnr_timer & 0x1f)), psn);
        return;
    }
    std::shared_lock mr_lock(MrTable::instance().mutex());
    if (flags & kIsWrite) {
        if (flags & kHasReth) {
            if (remoteRegion(qp, qp.ibv()->pd, qp.attr_.qp_access_flags, pkt.reth.rkey, pkt.reth.va,
                             pkt.reth.dma_len, IBV_ACCESS_REMOTE_WRITE) == nullptr) {
                mr_lock.unlock();
                qp.counters().add(Counter::kRespRemoteAccessErrors);
                failRequest(qp, kAethNakRemoteAccess, psn, IBV_EVENT_QP_ACCESS_ERR);
                return;
            }
            s.write_rkey = pkt.reth.rkey;
            s.write_va = pkt.reth.va;
            s.write_resid = pkt.reth.dma_len;
            s.write_total = pkt.reth.dma_len;
            qp.counters().add(Counter::kRxWriteRequests);
        }
        const MemoryRegion *mr = MrTable::instance().lookupLocked(s.write_rkey);
        if (len > s.write_resid || (last && len != s.write_resid)) {
            mr_lock.unlock();
            failRequest(qp, kAethNakInvalidRequest, psn, IBV_EVENT_QP_REQ_ERR);
            return;
        }
        if (mr == nullptr || !mr->contains(s.write_va, len) ||
            !mr->write(s.write_va, pkt.payload, len)) {
            mr_lock.unlock();
            qp.counters().add(Counter::kRespRemoteAccessErrors);
            failRequest(qp, kAethNakRemoteAccess, psn, IBV_EVENT_QP_ACCESS_ERR);
            return;
        }
        s.write_va += len;
        s.write_resid -= len;
        s.op = last ? ResponderState::Op::kNone : ResponderState::Op::kWrite;
        mr_lock.unlock();
        if (last && (flags & kHasImm)) {
            // WRITE WITH IMMEDIATE: the data is placed, then a receive WQE is consumed and
            // completes as RECV_RDMA_WITH_IMM with the immediate and the message's length
            // (ibv_poll_cq(3)).
            if (!qp.completeRecvLocked(IBV_WC_RECV_RDMA_WITH_IMM, IBV_WC_SUCCESS, s.write_total,
                                       true, pkt.imm, pkt.bth.solicited)) {
                qp.fatalLocked();
                return;
            }
        }
    } else {
        if (flags & kIsFirst) {
            s.recv_taken = true;
            s.recv_offset = 0;
        }
        RecvWqe &w = qp.rq_.at(qp.rq_.head());
        if (s.recv_offset + len > w.capacity) {
            mr_lock.unlock();
            qp.counters().add(Counter::kRespLocalLengthError);
            qp.completeRecvLocked(IBV_WC_RECV, IBV_WC_LOC_LEN_ERR, 0, false, 0, false);
            failRequest(qp, kAethNakInvalidRequest, psn, IBV_EVENT_QP_REQ_ERR);
            return;
        }
        if (!scatterFromPacket(w.sges, w.num_sge, s.recv_offset, pkt.payload, len, qp.ibv()->pd)) {
            mr_lock.unlock();
            qp.completeRecvLocked(IBV_WC_RECV, IBV_WC_LOC_PROT_ERR, 0, false, 0, false);
            failRequest(qp, kAethNakRemoteOp, psn, IBV_EVENT_QP_ACCESS_ERR);
            return;
        }
        s.recv_offset += len;
        s.op = last ? ResponderState::Op::kNone : ResponderState::Op::kSend;
        mr_lock.unlock();
        if (last && !qp.completeRecvLocked(IBV_WC_RECV, IBV_WC_SUCCESS,
                                           static_cast<uint32_t>(s.recv_offset),
                                           (flags & kHasImm) != 0, pkt.imm, pkt.bth.solicited)) {
            qp.fatalLocked();
            return;
        }
    }
    s.epsn = psnAdd(s.epsn, 1);
    if (last) {
        s.msn = psnAdd(s.msn, 1);
    }
    if (pkt.bth.ack_req) {
        // Coalesced: the engine sends one ACK for the newest PSN after its receive batch.
        s.ack_pending = true;
        s.ack_psn = psn;
        if (!s.scheduled) {
            s.scheduled = true;
            qp.engine_->scheduleAck(&qp);
        }
    }
}

}  // namespace tensorlane::simhca
