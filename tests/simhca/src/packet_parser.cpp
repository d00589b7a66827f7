#include "packet_parser.hpp"

#include <cstring>

namespace tensorlane::simhca {

ParseResult parsePacket(const uint8_t *data, size_t len, const Ipv4UdpFlow &flow, bool verify_icrc,
                        Packet &out) {
    if (len < kBthBytes + kIcrcBytes) {
        return ParseResult::kTruncated;
    }
    out.bth = readBth(data);
    // IB spec 9.2.5: TVer is 0; C9-5 says packets of another version are silently dropped.
    if ((data[1] & 0x0f) != 0) {
        return ParseResult::kBadTver;
    }
    out.info = opcodeInfo(out.bth.opcode);
    if (out.info == nullptr) {
        return ParseResult::kUnknownOpcode;
    }
    const size_t hdr = out.info->header_bytes;
    if (len < hdr + kIcrcBytes) {
        return ParseResult::kTruncated;
    }
    const size_t body = len - hdr - kIcrcBytes;
    if (out.bth.pad > body || (!(out.info->flags & kHasPayload) && body != 0)) {
        return ParseResult::kBadPad;
    }
    if (verify_icrc) {
        uint8_t ip_udp[kIpv4UdpBytes];
        buildIpv4UdpHeader(ip_udp, flow, len);
        uint8_t want[4];
        icrcStore(icrcOf(ip_udp, data, len - kIcrcBytes), want);
        if (std::memcmp(want, data + len - kIcrcBytes, 4) != 0) {
            return ParseResult::kBadIcrc;
        }
    }
    size_t off = kBthBytes;
    if (out.info->flags & kHasReth) {
        out.reth = readReth(data + off);
        off += kRethBytes;
    }
    if (out.info->flags & kHasAeth) {
        out.aeth = readAeth(data + off);
        off += kAethBytes;
    }
    if (out.info->flags & kHasImm) {
        out.imm = readBe32(data + off);
        off += kImmBytes;
    }
    out.payload = data + off;
    out.payload_len = static_cast<uint32_t>(body - out.bth.pad);
    return ParseResult::kOk;
}

const char *parseResultName(ParseResult r) {
    switch (r) {
        case ParseResult::kOk:
            return "ok";
        case ParseResult::kTruncated:
            return "truncated";
        case ParseResult::kBadTver:
            return "bad_tver";
        case ParseResult::kUnknownOpcode:
            return "unknown_opcode";
        case ParseResult::kBadPad:
            return "bad_pad";
        case ParseResult::kBadIcrc:
            return "bad_icrc";
    }
    return "?";
}

}  // namespace tensorlane::simhca
