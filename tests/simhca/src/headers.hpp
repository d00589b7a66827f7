// The RoCEv2 transport headers: BTH, RETH, AETH and ImmDt (IB spec vol. 1, 9.2-9.3; RoCEv2 is
// Annex A17: the same headers after IPv4/UDP to port 4791). All fields are big-endian on the wire.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tensorlane::simhca {

/// The UDP port IANA assigned to RoCEv2 (Annex A17.4.5.1).
constexpr uint16_t kRoceV2Port = 4791;
/// Base transport header size (IB spec 9.2).
constexpr size_t kBthBytes = 12;
/// RDMA extended transport header size (9.3.3).
constexpr size_t kRethBytes = 16;
/// ACK extended transport header size (9.3.5).
constexpr size_t kAethBytes = 4;
/// Immediate data size (9.3.6).
constexpr size_t kImmBytes = 4;
/// Invariant CRC size (7.8.1).
constexpr size_t kIcrcBytes = 4;
/// Default partition key, full membership (10.9.1.2).
constexpr uint16_t kDefaultPkey = 0xffff;
/// PSNs are 24 bits (9.2.8).
constexpr uint32_t kPsnMask = 0xffffff;
/// QPNs are 24 bits.
constexpr uint32_t kQpnMask = 0xffffff;

/// Base transport header fields.
struct Bth {
    uint8_t opcode = 0;
    bool solicited = false;
    bool mig_req = true;
    uint8_t pad = 0;  ///< bytes of padding before the ICRC, to a multiple of 4
    uint16_t pkey = kDefaultPkey;
    bool fecn = false;
    bool becn = false;
    uint32_t dest_qpn = 0;  ///< 24 bits
    bool ack_req = false;
    uint32_t psn = 0;  ///< 24 bits
};

/// RDMA extended transport header (WRITE first/only, READ request).
struct Reth {
    uint64_t va = 0;
    uint32_t rkey = 0;
    uint32_t dma_len = 0;
};

/// AETH syndromes (IB spec Table 42): the top three bits say ACK, RNR NAK or NAK.
enum AethSyndrome : uint8_t {
    kAethAck = 0x00,                ///< ACK; low five bits are the credit count
    kAethRnrNak = 0x20,             ///< RNR NAK; low five bits are the RNR timer
    kAethNakSeqErr = 0x60,          ///< NAK: PSN sequence error
    kAethNakInvalidRequest = 0x61,  ///< NAK: invalid request
    kAethNakRemoteAccess = 0x62,    ///< NAK: remote access error
    kAethNakRemoteOp = 0x63,        ///< NAK: remote operational error
    kAethCreditsInvalid = 0x1f,     ///< credit count "invalid": no end-to-end flow control
};

/// ACK extended transport header.
struct Aeth {
    uint8_t syndrome = kAethAck | kAethCreditsInvalid;
    uint32_t msn = 0;  ///< 24 bits
};

/// Writes a BTH at p (12 bytes).
void writeBth(uint8_t *p, const Bth &bth);
/// Reads a BTH from p (12 bytes).
[[nodiscard]] Bth readBth(const uint8_t *p);
/// Writes a RETH at p (16 bytes).
void writeReth(uint8_t *p, const Reth &reth);
/// Reads a RETH from p.
[[nodiscard]] Reth readReth(const uint8_t *p);
/// Writes an AETH at p (4 bytes).
void writeAeth(uint8_t *p, const Aeth &aeth);
/// Reads an AETH from p.
[[nodiscard]] Aeth readAeth(const uint8_t *p);
/// Writes a 32-bit big-endian value.
void writeBe32(uint8_t *p, uint32_t v);
/// Reads a 32-bit big-endian value.
[[nodiscard]] uint32_t readBe32(const uint8_t *p);

}  // namespace tensorlane::simhca
