// The completer (rxe_comp.c): reads ACKs, NAKs and READ responses, retires send WQEs in order,
// makes their completions, and drives retries: sequence NAKs and timeouts go back N, RNR NAKs
// wait the timer the responder named, errors end the QP (IB spec 9.7.5.1, 9.9.3).
#pragma once

#include <cstdint>

namespace tensorlane::simhca {

class SimQp;
struct Packet;

/// Response handling for one QP; every call holds the QP's lock.
class Completer {
public:
    /// An ACK, NAK or READ response arrived.
    static void receive(SimQp &qp, const Packet &pkt);
    /// The transport timer or the RNR back-off expired.
    static void onTimer(SimQp &qp, int64_t now);
    /// Retires acknowledged WQEs from the head of the send queue.
    static void retire(SimQp &qp);

private:
    static bool ackThrough(SimQp &qp, uint32_t psn, bool &rewound);
    static uint64_t wqeOf(SimQp &qp, uint32_t psn);
};

/// The RNR NAK timer field in nanoseconds (IB spec Table 45; 0 means 655.36 ms).
[[nodiscard]] int64_t rnrTimerNs(uint8_t field);

}  // namespace tensorlane::simhca
