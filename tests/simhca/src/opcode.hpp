// The RC opcode table, in the manner of rxe_opcode.c: each opcode with the headers that follow
// its BTH and what the requester, responder and completer do with it (IB spec 1.4, vol. 1,
// section 9.2 and Table 38 "OpCode field").
#pragma once

#include <cstdint>

namespace tensorlane::simhca {

/// The base transport header opcodes of the Reliable Connection service (IB spec Table 38).
enum class Opcode : uint8_t {
    kSendFirst = 0x00,
    kSendMiddle = 0x01,
    kSendLast = 0x02,
    kSendLastWithImm = 0x03,
    kSendOnly = 0x04,
    kSendOnlyWithImm = 0x05,
    kWriteFirst = 0x06,
    kWriteMiddle = 0x07,
    kWriteLast = 0x08,
    kWriteLastWithImm = 0x09,
    kWriteOnly = 0x0a,
    kWriteOnlyWithImm = 0x0b,
    kReadRequest = 0x0c,
    kReadResponseFirst = 0x0d,
    kReadResponseMiddle = 0x0e,
    kReadResponseLast = 0x0f,
    kReadResponseOnly = 0x10,
    kAcknowledge = 0x11,
};

/// Properties of an opcode, as bits (rxe's RXE_*_MASK).
enum OpcodeFlag : uint32_t {
    kHasReth = 1u << 0,        ///< an RDMA extended transport header follows the BTH
    kHasAeth = 1u << 1,        ///< an ACK extended transport header follows
    kHasImm = 1u << 2,         ///< immediate data follows
    kHasPayload = 1u << 3,     ///< carries data
    kIsRequest = 1u << 4,      ///< handled by the responder
    kIsResponse = 1u << 5,     ///< handled by the completer
    kIsFirst = 1u << 6,        ///< first packet of a multi-packet message
    kIsMiddle = 1u << 7,       ///< middle packet
    kIsLast = 1u << 8,         ///< last packet of a message (ONLY packets are FIRST|LAST)
    kIsWrite = 1u << 9,        ///< an RDMA WRITE
    kIsSend = 1u << 10,        ///< a SEND
    kIsRead = 1u << 11,        ///< a READ request or response
    kConsumesRecv = 1u << 12,  ///< takes a receive WQE (SEND first/only, WRITE with imm last/only)
};

/// One row of the opcode table.
struct OpcodeInfo {
    const char *name;      ///< as tshark names it
    uint32_t flags;        ///< OpcodeFlag bits
    uint8_t header_bytes;  ///< BTH plus the extended headers, before the payload
};

/// The row for an RC opcode, or nullptr for anything this simulator does not speak (UC, UD,
/// atomics, XRC): such packets are dropped and counted.
[[nodiscard]] const OpcodeInfo *opcodeInfo(uint8_t opcode);

}  // namespace tensorlane::simhca
