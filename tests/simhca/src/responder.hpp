// The responder (rxe_resp.c): checks each request's PSN, opcode sequence, keys, bounds and
// access, places WRITE and SEND data, consumes receive WQEs, answers READs, and acknowledges:
// coalesced ACKs, one sequence NAK per gap, RNR NAKs when no receive WQE is posted, and
// error NAKs that take the QP to ERR (IB spec 9.7.5.2).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

namespace tensorlane::simhca {

class SimQp;
struct Packet;

/// Request handling for one QP; every call holds the QP's lock.
class Responder {
public:
    /// A request packet arrived.
    static void receive(SimQp &qp, const Packet &pkt);
    /// Sends the coalesced ACK owed, if any.
    static void flushAck(SimQp &qp);
    /// Sends an ACK or NAK now.
    static void sendAck(SimQp &qp, uint8_t syndrome, uint32_t psn);

private:
    static bool executeRead(SimQp &qp, const Packet &pkt, bool duplicate);
    static void failRequest(SimQp &qp, uint8_t syndrome, uint32_t psn, ibv_event_type event);
};

}  // namespace tensorlane::simhca
