// The requester (rxe_req.c): turns send WQEs into request packets in PSN order, split by the path
// MTU, within a window of unacknowledged PSNs, and goes back to a PSN when told (go-back-N,
// IB spec 9.7.4.1.4: the requester retransmits from the PSN a NAK or a timeout names).
#pragma once

#include <cstdint>

namespace tensorlane::simhca {

class SimQp;

/// Request generation for one QP; every call holds the QP's lock.
class Requester {
public:
    /// Sends every packet the window, the fence and the RNR back-off allow.
    static void push(SimQp &qp);
    /// Makes psn (inside a WQE already started) the next PSN to send.
    static void rewind(SimQp &qp, uint32_t psn);
    /// Starts or restarts the transport timer (4.096 us * 2^timeout; timeout 0 is infinite).
    static void restartTimer(SimQp &qp);

private:
    static uint32_t readsBefore(SimQp &qp, uint64_t pos);
};

}  // namespace tensorlane::simhca
