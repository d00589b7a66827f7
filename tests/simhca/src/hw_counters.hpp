// Port counters in the names mlx5 exposes under ports/<p>/hw_counters (Documentation in
// drivers/infiniband/hw/mlx5/counters.c and the mlx5 "Understanding mlx5 Linux counters" note),
// kept in memory with atomics and written back to the tree by the engine thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

namespace tensorlane::simhca {

/// The counters modelled. Names and meanings follow mlx5; those marked "sim_" have no mlx5
/// equivalent and are documented in docs/simhca.md.
enum class Counter : int {
    kOutOfSequence,            ///< responder: request PSN ahead of the expected PSN
    kPacketSeqErr,             ///< requester: NAK sequence errors received
    kLocalAckTimeoutErr,       ///< requester: transport timer expiries
    kRnrNakRetryErr,           ///< requester: RNR NAKs received (retry limit not exceeded)
    kDuplicateRequest,         ///< responder: duplicate requests received
    kImpliedNakSeqErr,         ///< requester: READ responses implied missing by a later ACK
    kRxWriteRequests,          ///< responder: RDMA WRITE messages received
    kRxReadRequests,           ///< responder: RDMA READ requests received
    kOutOfBuffer,              ///< responder: SEND/WRITE-with-imm with no receive WQE (RNR)
    kRespRemoteAccessErrors,   ///< responder: R_Key, bounds or access violations
    kReqRemoteAccessErrors,    ///< requester: NAK remote access error received
    kReqRemoteInvalidRequest,  ///< requester: NAK invalid request received
    kRespLocalLengthError,     ///< responder: message longer than the receive buffer
    kReqCqeError,              ///< requester: error completions
    kRespCqeError,             ///< responder: error completions
    kReqCqeFlushError,         ///< requester: flushed WQEs
    kRespCqeFlushError,        ///< responder: flushed WQEs
    kRxIcrcEncapsulated,       ///< packets dropped for a bad ICRC
    kRxAtomicRequests,         ///< always 0: atomics are not modelled
    kRoceAdpRetrans,           ///< always 0: adaptive retransmission is not modelled
    kNpCnpSent,                ///< always 0: DCQCN is not modelled
    kRpCnpHandled,             ///< always 0
    kNpEcnMarkedRocePackets,   ///< always 0
    kSimRxPackets,             ///< sim_: RoCE packets received and parsed
    kSimTxPackets,             ///< sim_: RoCE packets sent
    kSimTxRetransmits,         ///< sim_: request packets sent again (go-back-N or RNR)
    kSimRxMalformed,           ///< sim_: dropped: truncated, bad version, opcode or pad
    kSimRxUnknownQp,           ///< sim_: dropped: no QP with that number in RTR/RTS
    kSimRxDroppedPortDown,     ///< sim_: dropped or not sent: port not ACTIVE
    kCount,
};

/// The counters of one port.
class HwCounters {
public:
    /// Adds n to a counter (relaxed: counters are statistics, read whole by flush()).
    void add(Counter c, uint64_t n = 1) {
        values_[static_cast<int>(c)].fetch_add(n, std::memory_order_relaxed);
        dirty_.store(true, std::memory_order_relaxed);
    }
    /// The current value of a counter.
    [[nodiscard]] uint64_t get(Counter c) const {
        return values_[static_cast<int>(c)].load(std::memory_order_relaxed);
    }
    /// Seeds the counters from the files in dir (a device's counters outlive one process).
    void load(const std::string &dir);
    /// Writes every counter to dir/<name> when something changed since the last flush.
    void flush(const std::string &dir, bool force = false);
    /// The sysfs file name of a counter.
    [[nodiscard]] static const char *name(Counter c);

private:
    std::array<std::atomic<uint64_t>, static_cast<int>(Counter::kCount)> values_{};
    std::atomic<bool> dirty_{true};
};

}  // namespace tensorlane::simhca
