// An RC queue pair: its attributes and state machine (modify/query), its work queues, and the
// three roles that move its packets, each in its own file as in rxe: the requester
// (requester.cpp) sends requests, the responder (responder.cpp) executes them and acknowledges,
// the completer (completer.cpp) retires send WQEs on acknowledgements and READ responses.
//
// Locking: mutex_ guards everything below it. It is taken by the posting thread (post_send,
// post_recv, modify, query) and by the engine thread (packets, timers). Lock order:
// Engine registry (shared) -> SimQp::mutex_ -> MrTable (shared) -> SimCq -> CompChannel.
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>

#include "handles.hpp"
#include "hw_counters.hpp"
#include "packet_parser.hpp"
#include "qp_ex_ops.hpp"
#include "tx_path.hpp"
#include "work_queues.hpp"

namespace tensorlane::simhca {

class Engine;

/// Monotonic nanoseconds (CLOCK_MONOTONIC), the engine's time base.
[[nodiscard]] int64_t nowNs();

/// Limits this simulator reports in ibv_query_device() and enforces at QP creation.
constexpr uint32_t kMaxQpWr = 16384;
constexpr uint32_t kMaxSge = 32;
constexpr uint32_t kMaxInline = 512;
constexpr uint32_t kMaxCqe = 1 << 20;
constexpr uint8_t kMaxRdAtomic = 16;
/// Request packets in flight per QP before the requester waits for ACKs (the simulator's
/// stand-in for the NIC's limit on outstanding PSNs; sized for the receiver's socket buffer).
constexpr int32_t kSendWindow = 384;
/// The requester asks for an ACK at least this often inside a long message, so the window opens
/// before the message ends (IB spec 9.7.5.1.6: AckReq may be set on any packet).
constexpr uint32_t kAckReqInterval = 32;

/// The requester's position in the send queue (rxe_req.c's qp->req).
struct RequesterState {
    uint64_t next = 0;      ///< the WQE being (re)transmitted
    uint64_t started = 0;   ///< one past the last WQE ever given PSNs
    uint32_t next_pkt = 0;  ///< its packets already sent
    uint32_t next_psn = 0;  ///< PSN of the next request packet
    uint32_t una = 0;       ///< oldest PSN not yet acknowledged
    uint32_t retry_left = 7;
    uint32_t rnr_left = 7;
    int64_t timer_ns = 0;     ///< transport timer deadline; 0 when stopped
    int64_t rnr_wait_ns = 0;  ///< RNR NAK back-off deadline; 0 when not waiting
    uint32_t reads_in_flight = 0;
    uint32_t max_psn_sent = 0;  ///< highest PSN ever sent + 1 (to count retransmissions)
};

/// The responder's state (rxe_resp.c's qp->resp).
struct ResponderState {
    uint32_t epsn = 0;      ///< expected PSN
    uint32_t msn = 0;       ///< message sequence number (AETH)
    bool nak_sent = false;  ///< a sequence NAK is outstanding (IB spec 9.7.5.2.2: one only)
    enum class Op { kNone, kSend, kWrite } op = Op::kNone;  ///< multi-packet message in progress
    uint32_t write_rkey = 0;
    uint64_t write_va = 0;
    uint32_t write_resid = 0;
    uint32_t write_total = 0;
    bool recv_taken = false;  ///< the head receive WQE belongs to the message in progress
    uint64_t recv_offset = 0;
    bool ack_pending = false;
    uint32_t ack_psn = 0;
    bool scheduled = false;  ///< on the engine's list of QPs to flush ACKs for
};

/// One RC QP.
class SimQp {
public:
    /// Creates a QP (ibv_create_qp_ex attributes already checked).
    SimQp(SimContext *ctx, const ibv_qp_init_attr_ex &attr, uint32_t qpn, Engine *engine);
    ~SimQp();
    SimQp(const SimQp &) = delete;
    SimQp &operator=(const SimQp &) = delete;

    /// What the application holds.
    [[nodiscard]] ibv_qp *ibv() { return &handle_.ibv.qp_base; }
    /// As ibv_qp_ex (the new post-send API).
    [[nodiscard]] ibv_qp_ex *ibvEx() { return &handle_.ibv; }
    /// The QP behind an ibv_qp this library handed out.
    [[nodiscard]] static SimQp *from(ibv_qp *qp) {
        return handleOf<QpHandle>(reinterpret_cast<ibv_qp_ex *>(qp))->self;
    }
    /// The QP number.
    [[nodiscard]] uint32_t qpn() const { return qpn_; }
    /// The device this QP is on.
    [[nodiscard]] SimDevice &device() const;

    /// ibv_modify_qp(): 0 or an errno value.
    [[nodiscard]] int modify(const ibv_qp_attr &attr, int mask);
    /// ibv_query_qp().
    [[nodiscard]] int query(ibv_qp_attr &attr, int mask, ibv_qp_init_attr &init);
    /// ibv_post_send().
    [[nodiscard]] int postSend(ibv_send_wr *wr, ibv_send_wr **bad);
    /// ibv_post_recv().
    [[nodiscard]] int postRecv(ibv_recv_wr *wr, ibv_recv_wr **bad);

    /// Engine: a packet for this QP arrived from src (host-order address and port).
    void receive(const Packet &pkt, uint32_t src_ip, uint16_t src_port);
    /// Engine: timers that are due; returns the next deadline (0: none).
    int64_t onTimer(int64_t now);
    /// Engine: sends the coalesced ACK, if one is owed.
    void flushAck();
    /// The earliest timer deadline (0: none); read without the lock by the engine.
    [[nodiscard]] int64_t deadline() const { return deadline_.load(std::memory_order_relaxed); }

private:
    friend class Requester;
    friend class Responder;
    friend class Completer;

    int modifyLocked(const ibv_qp_attr &attr, int mask);
    int checkAttrLocked(const ibv_qp_attr &attr, int mask, ibv_qp_state next);
    int openPathLocked();
    void enterErrorLocked();
    void flushLocked();
    void resetLocked();
    void updateDeadlineLocked();
    /// Completes a send WQE (signalled or failed ones make a CQE); false when the CQ overran.
    bool completeSendLocked(SendWqe &wqe, ibv_wc_status status);
    /// Completes the head receive WQE.
    bool completeRecvLocked(ibv_wc_opcode opcode, ibv_wc_status status, uint32_t byte_len,
                            bool with_imm, uint32_t imm_host, bool solicited);
    /// Moves to ERR after a local error (CQ overrun): flushes and raises IBV_EVENT_QP_FATAL.
    void fatalLocked();
    void postAsyncEvent(ibv_event_type type);
    HwCounters &counters() const { return *counters_; }
    [[nodiscard]] bool portActive() const;

    SimContext *ctx_;
    Engine *engine_;
    uint32_t qpn_;
    QpHandle handle_{};
    HwCounters *counters_ = nullptr;

    std::mutex mutex_;
    ibv_qp_state state_ = IBV_QPS_RESET;
    ibv_qp_attr attr_{};  ///< as set by modify (the values ibv_query_qp returns)
    ibv_qp_cap cap_{};
    bool sq_sig_all_ = false;
    SimCq *send_cq_;
    SimCq *recv_cq_;
    uint32_t mtu_bytes_ = 1024;
    uint32_t dst_ip_ = 0;  ///< host order
    uint32_t src_ip_ = 0;
    WqRing<SendWqe> sq_;
    WqRing<RecvWqe> rq_;
    RequesterState req_;
    ResponderState resp_;
    TxPath tx_;
    std::atomic<int64_t> deadline_{0};

    // The new post-send API (ibv_wr_start .. ibv_wr_complete): used by the posting thread only,
    // as ibv_wr_post(3) requires the caller to serialise a QP's ibv_wr_* calls.
    friend struct QpExOps;
    QpExBatch ex_;
};

}  // namespace tensorlane::simhca
