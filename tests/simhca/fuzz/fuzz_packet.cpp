// libFuzzer target: the RoCEv2 packet parser (packet_parser.cpp) and the header readers it uses,
// fed arbitrary UDP payloads as they would arrive on port 4791. The first byte picks the flow
// the datagram claims to come from, so the ICRC check sees varied pseudo-headers; the parser
// must reject or accept without reading out of bounds, and a packet it accepts must be
// self-consistent (payload inside the datagram, headers as the opcode table says).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "headers.hpp"
#include "icrc.hpp"
#include "opcode.hpp"
#include "packet_parser.hpp"

using namespace tensorlane::simhca;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) {
        return 0;
    }
    Ipv4UdpFlow flow;
    flow.src_ip = 0x7f000002u + (data[0] & 0x0f);
    flow.dst_ip = 0x7f000003u;
    flow.src_port = static_cast<uint16_t>(0xc000 | data[0]);
    flow.dst_port = kRoceV2Port;
    const uint8_t *p = data + 1;
    const size_t n = size - 1;
    for (bool verify : {true, false}) {
        Packet pkt;
        if (parsePacket(p, n, flow, verify, pkt) != ParseResult::kOk) {
            continue;
        }
        if (pkt.info == nullptr || pkt.info != opcodeInfo(pkt.bth.opcode) || pkt.payload < p ||
            pkt.payload + pkt.payload_len > p + n || pkt.payload != p + pkt.info->header_bytes) {
            std::abort();
        }
        // Touch every payload byte, as placement would.
        volatile uint8_t sink = 0;
        for (uint32_t i = 0; i < pkt.payload_len; ++i) {
            sink = static_cast<uint8_t>(sink ^ pkt.payload[i]);
        }
        (void)sink;
    }
    return 0;
}
