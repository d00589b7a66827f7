// The send side of one QP on the wire: a UDP socket bound to the QP's source address and port,
// and a batch of prepared packets handed to sendmmsg(2) at once.
//
// Why one socket a QP: RoCEv2 derives the UDP source port from the QP number (Annex A17.4.5.2;
// rxe: 0xc000 | hash_32(qpn, 14)) so that ECMP spreads QPs; a socket bound to that port sends
// with it. The socket is never connected and always sets DF, so Linux writes IPv4 id 0
// (ip_select_ident_segs()), which is what lets the receiver, who never sees the IP header,
// check the ICRC (icrc.hpp).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <array>
#include <cstdint>
#include <memory>

#include "icrc.hpp"

namespace tensorlane::simhca {

/// The UDP source port rxe uses for a QP (rxe_qp.c: RXE_ROCE_V2_SPORT + hash_32(qpn, 14)).
[[nodiscard]] uint16_t roceSourcePort(uint32_t qpn);

/// Packets per sendmmsg(2) call.
constexpr int kTxBatch = 64;
/// Pieces of one packet: header, up to four payload pieces, pad+ICRC.
constexpr int kTxIov = 6;
/// Largest header: BTH + RETH + ImmDt (or AETH).
constexpr int kMaxHeader = 48;

/// One packet being prepared.
struct TxPacket {
    uint8_t header[kMaxHeader];
    uint8_t trailer[8];                 ///< pad (up to 3 zero bytes) and the ICRC
    std::unique_ptr<uint8_t[]> bounce;  ///< payload copied out of non-host memory
    iovec iov[kTxIov];
    int niov = 0;
    size_t header_len = 0;
    size_t payload_len = 0;
    uint32_t icrc = 0;  ///< running ICRC while payload pieces are added
};

/// A QP's socket and its batch.
class TxPath {
public:
    TxPath() = default;
    ~TxPath();
    TxPath(const TxPath &) = delete;
    TxPath &operator=(const TxPath &) = delete;

    /// Opens the socket bound to src_ip:src_port (host order) with the GRH's traffic class as
    /// IP TOS and hop limit as TTL; errno-style error or 0.
    [[nodiscard]] int open(uint32_t src_ip, uint16_t src_port, uint32_t dst_ip, uint8_t tos,
                           uint8_t ttl);
    /// Changes TOS/TTL (modify_qp RTS->RTS with a new AV is not allowed; SQD->SQD is).
    void setTosTtl(uint8_t tos, uint8_t ttl);
    /// Whether open() succeeded.
    [[nodiscard]] bool isOpen() const { return fd_ >= 0; }
    /// Starts a packet whose headers (header_len bytes) the caller writes into the result.
    [[nodiscard]] TxPacket &begin(size_t header_len);
    /// Adds payload bytes that stay valid until flush() (host memory, zero copy).
    void addPayload(TxPacket &p, const uint8_t *data, size_t n);
    /// A buffer of n bytes (n <= 4096) in the packet for payload copied from device memory.
    [[nodiscard]] uint8_t *bounce(TxPacket &p, size_t n);
    /// Pads, computes the ICRC and queues the packet.
    void finish(TxPacket &p);
    /// Sends every queued packet; returns how many went out.
    int flush();
    /// Packets queued and not yet flushed.
    [[nodiscard]] int pending() const { return count_; }

private:
    int fd_ = -1;
    Ipv4UdpFlow flow_;
    sockaddr_in dst_{};
    uint8_t ip_udp_template_[kIpv4UdpBytes]{};
    std::array<TxPacket, kTxBatch> packets_;
    std::array<mmsghdr, kTxBatch> msgs_{};
    int count_ = 0;
};

}  // namespace tensorlane::simhca
