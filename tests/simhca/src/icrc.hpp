// The RoCEv2 invariant CRC, computed as rxe_icrc.c does (IB spec Annex A17.3.3): CRC-32 (the
// Ethernet polynomial) over the IPv4 and UDP headers with the variant fields masked to ones, the
// BTH with its resv8a byte masked, the rest of the headers and the payload with its pad.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tensorlane::simhca {

/// IPv4 (20 bytes, no options) plus UDP (8 bytes).
constexpr size_t kIpv4UdpBytes = 28;

/// What the receiver of a UDP datagram knows of the IPv4/UDP headers around it. A UDP socket
/// does not see the IPv4 identification or flags; the simulator always sends with DF set on an
/// unconnected socket, for which Linux writes id 0 (ip_select_ident_segs()), so those are known.
struct Ipv4UdpFlow {
    uint32_t src_ip = 0;  ///< host order
    uint32_t dst_ip = 0;  ///< host order
    uint16_t src_port = 0;
    uint16_t dst_port = 0;
    uint16_t ip_id = 0;
    uint16_t frag_off = 0x4000;  ///< DF
};

/// Builds the IPv4+UDP headers a datagram of udp_payload_len bytes carries on the wire.
void buildIpv4UdpHeader(uint8_t out[kIpv4UdpBytes], const Ipv4UdpFlow &flow,
                        size_t udp_payload_len);

/// Starts an ICRC over the IPv4+UDP headers (as on the wire; masked here) and the BTH.
/// Returns a running value for icrcUpdate().
[[nodiscard]] uint32_t icrcBegin(const uint8_t ip_udp[kIpv4UdpBytes], const uint8_t *bth);
/// Continues the ICRC over more bytes (the extended headers, payload and pad).
[[nodiscard]] uint32_t icrcUpdate(uint32_t running, const uint8_t *data, size_t len);
/// The four ICRC bytes as they go on the wire: rxe stores ~crc32_le in CPU order (x86: little
/// endian), which is what every RoCE NIC checks.
void icrcStore(uint32_t running, uint8_t out[4]);
/// Convenience: the ICRC of one contiguous packet (headers from BTH to the end of the pad).
[[nodiscard]] uint32_t icrcOf(const uint8_t ip_udp[kIpv4UdpBytes], const uint8_t *bth_to_pad,
                              size_t len);

}  // namespace tensorlane::simhca
