#include "completer.hpp"

#include <algorithm>
#include <mutex>

#include "headers.hpp"
#include "mr_table.hpp"
#include "opcode.hpp"
#include "packet_parser.hpp"
#include "psn.hpp"
#include "qp.hpp"
#include "requester.hpp"
#include "sge_copy.hpp"

namespace tensorlane::simhca {
// The WQE position whose PSN range holds psn, among those sent; tail() when none does.
uint64_t Completer::wqeOf(SimQp &qp, uint32_t psn) {
    WqRing<SendWqe> &sq = qp.sq_;
    const RequesterState &r = qp.req_;
    for (uint64_t pos = sq.head(); pos < sq.tail() && pos < r.started; ++pos) {
        const SendWqe &w = sq.at(pos);
        const int32_t off = psnDiff(psn, w.first_psn);
        if (off >= 0 && off < static_cast<int32_t>(w.npackets)) {
            return pos;
        }
    }
    return sq.tail();
}

int64_t rnrTimerNs(uint8_t field) {
    // IB spec Table 45, in units of 10 us.
    static constexpr int64_t kTable[32] = {65536, 1,    2,    3,     4,     6,     8,     12,
                                           16,    24,   32,   48,    64,    96,    128,   192,
                                           256,   384,  512,  768,   1024,  1536,  2048,  3072,
                                           4096,  6144, 8192, 12288, 16384, 24576, 32768, 49152};
    return kTable[field & 31] * 10'000;
}

void Completer::retire(SimQp &qp) {
    RequesterState &r = qp.req_;
    while (!qp.sq_.empty() && qp.sq_.head() < r.started) {
        SendWqe &w = qp.sq_.at(qp.sq_.head());
        if (w.opcode == IBV_WR_RDMA_READ) {
            if (w.read_next < w.npackets) {
                return;
            }
        } else if (psnDiff(r.una, psnAdd(w.first_psn, w.npackets)) < 0) {
            return;
        }
        w.done = true;
        const bool ok = qp.completeSendLocked(w, IBV_WC_SUCCESS);
        qp.sq_.pop();
        if (!ok) {
            qp.fatalLocked();
            return;
        }
    }
}

// Everything up to and including psn is acknowledged (IB spec 9.7.5.1.2: ACKs are cumulative).
// A READ whose responses have not all come is not: its missing responses are "implied NAKs"
// (9.7.5.1.5) and the requester asks again from the first one missing.
bool Completer::ackThrough(SimQp &qp, uint32_t psn, bool &rewound) {
    WqRing<SendWqe> &sq = qp.sq_;
    RequesterState &r = qp.req_;
    HwCounters &counters = qp.counters();
    const uint32_t upto = psnAdd(psn, 1);
    if (psnDiff(upto, r.una) <= 0 || psnDiff(upto, r.max_psn_sent) > 0) {
        return false;  // old, or acknowledges what was never sent: ignored (9.7.5.1.1)
    }
    for (uint64_t pos = sq.head(); pos < sq.tail() && pos < r.started; ++pos) {
        SendWqe &w = sq.at(pos);
        if (psnDiff(w.first_psn, upto) >= 0) {
            break;
        }
        if (w.opcode == IBV_WR_RDMA_READ && w.read_next < w.npackets) {
            const uint32_t missing = psnAdd(w.first_psn, w.read_next);
            if (psnDiff(missing, upto) < 0) {
                counters.add(Counter::kImpliedNakSeqErr);
                if (psnDiff(missing, r.una) > 0) {
                    r.una = missing;
                }
                Requester::rewind(qp, missing);
                rewound = true;
                return true;
            }
        }
    }
    r.una = upto;
    if (psnDiff(r.una, r.next_psn) > 0) {
        // Acknowledged beyond where a go-back restarted: skip what the peer already has.
        Requester::rewind(qp, r.una);
    }
    return true;
}

void Completer::receive(SimQp &qp, const Packet &pkt) {
    RequesterState &r = qp.req_;
    if (qp.state_ != IBV_QPS_RTS && qp.state_ != IBV_QPS_SQD) {
        return;
    }
    const uint32_t psn = pkt.bth.psn;
    bool progress = false;
    bool rewound = false;
    if (pkt.info->flags & kIsRead) {
        const uint64_t pos = wqeOf(qp, psn);
        if (pos == qp.sq_.tail() || psnDiff(psn, r.una) < 0) {
            return;  // duplicate or stray response: dropped (9.7.5.1.1)
        }
        SendWqe &w = qp.sq_.at(pos);
        if (w.opcode != IBV_WR_RDMA_READ) {
            return;
        }
        // Responses before this READ's PSNs acknowledge the requests before it.
        if (psnDiff(w.first_psn, r.una) > 0) {
            progress = ackThrough(qp, psnAdd(w.first_psn, kPsnMask), rewound);
            if (rewound) {
                Requester::push(qp);
                return;
            }
        }
        const uint32_t expect = psnAdd(w.first_psn, w.read_next);
        if (psn != expect) {
            return;  // a response is missing: the transport timer goes back for it
        }
        const uint64_t off = uint64_t{w.read_next} * qp.mtu_bytes_;
        const uint32_t want =
            static_cast<uint32_t>(std::min<uint64_t>(qp.mtu_bytes_, w.length - off));
        if (pkt.payload_len != want) {
            return;  // malformed response: dropped
        }
        bool ok;
        {
            std::shared_lock mr_lock(MrTable::instance().mutex());
            ok = scatterFromPacket(w.sges, w.num_sge, off, pkt.payload, pkt.payload_len,
                                   qp.ibv()->pd);
        }
        if (!ok) {
            w.done = true;
            qp.completeSendLocked(w, IBV_WC_LOC_PROT_ERR);
            qp.enterErrorLocked();
            return;
        }
        ++w.read_next;
        r.una = psnAdd(psn, 1);
        progress = true;
    } else {
        const uint8_t syndrome = pkt.aeth.syndrome;
        switch (syndrome >> 5) {
            case 0:  // ACK
                progress = ackThrough(qp, psn, rewound);
                break;
            case 1: {  // RNR NAK: the responder had no receive WQE for psn
                progress = ackThrough(qp, psnAdd(psn, kPsnMask), rewound);
                qp.counters().add(Counter::kRnrNakRetryErr);
                if (r.rnr_left == 0) {
                    const uint64_t pos = wqeOf(qp, psn);
                    if (pos != qp.sq_.tail()) {
                        Completer::retire(qp);
                        SendWqe &w = qp.sq_.at(pos);
                        w.done = true;
                        qp.completeSendLocked(w, IBV_WC_RNR_RETRY_EXC_ERR);
                    }
                    qp.enterErrorLocked();
                    return;
                }
                if (qp.attr_.rnr_retry != 7) {  // 7 means retry forever (IB spec 9.7.5.2.8)
                    --r.rnr_left;
                }
                Requester::rewind(qp, psn);
                r.rnr_wait_ns = nowNs() + rnrTimerNs(syndrome & 0x1f);
                r.timer_ns = 0;
                qp.updateDeadlineLocked();
                Completer::retire(qp);
                return;
            }
            case 3: {  // NAK
                const uint8_t code = syndrome & 0x1f;
                progress = ackThrough(qp, psnAdd(psn, kPsnMask), rewound);
                if (code == 0) {
                    // PSN sequence error: go back to the PSN the responder expects.
                    qp.counters().add(Counter::kPacketSeqErr);
                    if (!progress) {
                        if (r.retry_left == 0) {
                            Completer::retire(qp);
                            if (!qp.sq_.empty()) {
                                SendWqe &w = qp.sq_.at(qp.sq_.head());
                                w.done = true;
                                qp.completeSendLocked(w, IBV_WC_RETRY_EXC_ERR);
                            }
                            qp.enterErrorLocked();
                            return;
                        }
                        --r.retry_left;
                    }
                    Requester::rewind(qp, psn);
                    rewound = true;
                    break;
                }
                ibv_wc_status status = IBV_WC_REM_OP_ERR;
                if (code == 1) {
                    status = IBV_WC_REM_INV_REQ_ERR;
                    qp.counters().add(Counter::kReqRemoteInvalidRequest);
                } else if (code == 2) {
                    status = IBV_WC_REM_ACCESS_ERR;
                    qp.counters().add(Counter::kReqRemoteAccessErrors);
                }
                Completer::retire(qp);
                const uint64_t pos = wqeOf(qp, psn);
                if (pos != qp.sq_.tail()) {
                    SendWqe &w = qp.sq_.at(pos);
                    w.done = true;
                    qp.completeSendLocked(w, status);
                }
                qp.enterErrorLocked();
                return;
            }
            default:
                return;  // reserved syndromes: ignored
        }
    }
    if (progress) {
        r.retry_left = qp.attr_.retry_cnt;
        r.rnr_left = qp.attr_.rnr_retry;
        Requester::restartTimer(qp);
    }
    Completer::retire(qp);
    if (progress || rewound) {
        Requester::push(qp);
    }
}

void Completer::onTimer(SimQp &qp, int64_t now) {
    RequesterState &r = qp.req_;
    if (r.rnr_wait_ns != 0 && now >= r.rnr_wait_ns) {
        r.rnr_wait_ns = 0;
        Requester::push(qp);
    }
    if (r.timer_ns != 0 && now >= r.timer_ns) {
        r.timer_ns = 0;
        if (psnDiff(r.next_psn, r.una) <= 0) {
            qp.updateDeadlineLocked();
            return;
        }
        qp.counters().add(Counter::kLocalAckTimeoutErr);
        if (r.retry_left == 0) {
            // IB spec 9.7.6.1.3: retries exhausted: the oldest WQE fails, the QP goes to ERR.
            Completer::retire(qp);
            if (!qp.sq_.empty()) {
                SendWqe &w = qp.sq_.at(qp.sq_.head());
                w.done = true;
                qp.completeSendLocked(w, IBV_WC_RETRY_EXC_ERR);
            }
            qp.enterErrorLocked();
            return;
        }
        --r.retry_left;
        Requester::rewind(qp, r.una);
        Requester::push(qp);
        Requester::restartTimer(qp);
    }
    qp.updateDeadlineLocked();
}

}  // namespace tensorlane::simhca
