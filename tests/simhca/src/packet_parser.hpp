// Parsing of one received RoCEv2 UDP payload: everything the engine trusts about a packet is
// checked here, before any QP sees it (rxe_recv.c: hdr_check, check_keys, rxe_icrc_check).
#pragma once

#include <cstddef>
#include <cstdint>

#include "headers.hpp"
#include "icrc.hpp"
#include "opcode.hpp"

namespace tensorlane::simhca {

/// Why a datagram was dropped before reaching a QP.
enum class ParseResult {
    kOk,
    kTruncated,      ///< shorter than its headers, pad and ICRC
    kBadTver,        ///< transport header version not 0
    kUnknownOpcode,  ///< not an RC opcode this simulator models
    kBadPad,         ///< pad larger than the payload, or payload where none belongs
    kBadIcrc,        ///< ICRC mismatch
};

/// A parsed packet; payload points into the datagram.
struct Packet {
    Bth bth;
    Reth reth;
    Aeth aeth;
    uint32_t imm = 0;  ///< as on the wire (big-endian value read into host order)
    const OpcodeInfo *info = nullptr;
    const uint8_t *payload = nullptr;
    uint32_t payload_len = 0;
};

/// Parses and checks a UDP payload received with the given flow. With verify_icrc false the
/// ICRC is not checked (the pcap checker checks it itself against the captured IP header).
[[nodiscard]] ParseResult parsePacket(const uint8_t *data, size_t len, const Ipv4UdpFlow &flow,
                                      bool verify_icrc, Packet &out);

/// A short name for a parse result, for counters and logs.
[[nodiscard]] const char *parseResultName(ParseResult r);

}  // namespace tensorlane::simhca
