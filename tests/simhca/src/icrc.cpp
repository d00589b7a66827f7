#include "icrc.hpp"

#include <zlib.h>

#include <cstring>

#include "headers.hpp"

namespace tensorlane::simhca {
namespace {

// rxe seeds crc32_le() with 0xdebb20e3: the CRC of eight 0xff bytes (the masked LRH of an IB
// packet, which RoCEv2 does not carry) from a seed of ~0. zlib's crc32() keeps its state
// inverted (crc32(c) = ~crc32_le(~c)), so the same running value in zlib's terms is ~0xdebb20e3.
constexpr uint32_t kZlibSeed = ~0xdebb20e3u;

uint32_t zcrc(uint32_t running, const uint8_t *data, size_t len) {
    return static_cast<uint32_t>(crc32_z(running, data, len));
}

}  // namespace

void buildIpv4UdpHeader(uint8_t out[kIpv4UdpBytes], const Ipv4UdpFlow &flow,
                        size_t udp_payload_len) {
    const size_t udp_len = udp_payload_len + 8;
    const size_t ip_len = udp_len + 20;
    out[0] = 0x45;
    out[1] = 0;  // TOS: masked in the ICRC
    out[2] = static_cast<uint8_t>(ip_len >> 8);
    out[3] = static_cast<uint8_t>(ip_len);
    out[4] = static_cast<uint8_t>(flow.ip_id >> 8);
    out[5] = static_cast<uint8_t>(flow.ip_id);
    out[6] = static_cast<uint8_t>(flow.frag_off >> 8);
    out[7] = static_cast<uint8_t>(flow.frag_off);
    out[8] = 64;            // TTL: masked
    out[9] = 17;            // UDP
    out[10] = out[11] = 0;  // checksum: masked
    writeBe32(out + 12, flow.src_ip);
    writeBe32(out + 16, flow.dst_ip);
    out[20] = static_cast<uint8_t>(flow.src_port >> 8);
    out[21] = static_cast<uint8_t>(flow.src_port);
    out[22] = static_cast<uint8_t>(flow.dst_port >> 8);
    out[23] = static_cast<uint8_t>(flow.dst_port);
    out[24] = static_cast<uint8_t>(udp_len >> 8);
    out[25] = static_cast<uint8_t>(udp_len);
    out[26] = out[27] = 0;  // checksum: masked
}

uint32_t icrcBegin(const uint8_t ip_udp[kIpv4UdpBytes], const uint8_t *bth) {
    uint8_t pseudo[kIpv4UdpBytes + kBthBytes];
    std::memcpy(pseudo, ip_udp, kIpv4UdpBytes);
    std::memcpy(pseudo + kIpv4UdpBytes, bth, kBthBytes);
    // Annex A17.3.3: the fields routers may change are replaced by ones: IPv4 TOS (DSCP+ECN),
    // TTL and header checksum; the UDP checksum; the BTH's resv8a byte (with FECN/BECN).
    pseudo[1] = 0xff;
    pseudo[8] = 0xff;
    pseudo[10] = pseudo[11] = 0xff;
    pseudo[26] = pseudo[27] = 0xff;
    pseudo[kIpv4UdpBytes + 4] = 0xff;
    return zcrc(kZlibSeed, pseudo, sizeof(pseudo));
}

uint32_t icrcUpdate(uint32_t running, const uint8_t *data, size_t len) {
    return zcrc(running, data, len);
}

void icrcStore(uint32_t running, uint8_t out[4]) {
    // rxe: *icrcp = ~crc32_le(...) = running (zlib's state is already inverted), stored in CPU
    // order; x86 and the IB spec's bit order agree that the low byte goes first.
    out[0] = static_cast<uint8_t>(running);
    out[1] = static_cast<uint8_t>(running >> 8);
    out[2] = static_cast<uint8_t>(running >> 16);
    out[3] = static_cast<uint8_t>(running >> 24);
}

uint32_t icrcOf(const uint8_t ip_udp[kIpv4UdpBytes], const uint8_t *bth_to_pad, size_t len) {
    const uint32_t r = icrcBegin(ip_udp, bth_to_pad);
    return icrcUpdate(r, bth_to_pad + kBthBytes, len - kBthBytes);
}

}  // namespace tensorlane::simhca
