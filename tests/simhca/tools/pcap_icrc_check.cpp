// pcap_icrc_check: reads a capture (classic pcap, as tcpdump -w writes) and checks the ICRC of
// every RoCEv2 packet (IPv4/UDP to port 4791) against the captured IP and UDP headers, the way a
// receiving NIC does (IB spec Annex A17.3.3; rxe_icrc.c). Prints a summary line; exits 1 if any
// ICRC is wrong or no RoCE packet was found, 2 on a bad file.
//
//   usage: pcap_icrc_check FILE.pcap [--verbose]
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "headers.hpp"
#include "icrc.hpp"
#include "opcode.hpp"

using namespace tensorlane::simhca;

namespace {

uint32_t rd32(const uint8_t *p, bool swap) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return swap ? __builtin_bswap32(v) : v;
}

// Where the IPv4 header starts for a pcap link type (and whether this frame is IPv4).
long ipOffset(uint32_t linktype, const uint8_t *f, size_t n) {
    switch (linktype) {
        case 1:  // DLT_EN10MB (also what tcpdump -i lo writes)
            if (n >= 14 && f[12] == 0x08 && f[13] == 0x00) {
                return 14;
            }
            if (n >= 18 && f[12] == 0x81 && f[13] == 0x00 && f[16] == 0x08 && f[17] == 0x00) {
                return 18;  // 802.1Q
            }
            return -1;
        case 113:  // DLT_LINUX_SLL (tcpdump -i any)
            return n >= 16 && f[14] == 0x08 && f[15] == 0x00 ? 16 : -1;
        case 276:  // DLT_LINUX_SLL2
            return n >= 20 && f[0] == 0x08 && f[1] == 0x00 ? 20 : -1;
        case 101:  // DLT_RAW
        case 12:
            return 0;
        default:
            return -1;
    }
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 2 || std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help") {
        std::cerr << "usage: pcap_icrc_check FILE.pcap [--verbose]\n";
        return argc < 2 ? 2 : 0;
    }
    const bool verbose = argc > 2 && std::string(argv[2]) == "--verbose";
    std::ifstream in(argv[1], std::ios::binary);
    std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
    if (file.size() < 24) {
        std::cerr << "pcap_icrc_check: " << argv[1] << ": not a pcap file\n";
        return 2;
    }
    const uint32_t magic = rd32(file.data(), false);
    bool swap;
    if (magic == 0xa1b2c3d4 || magic == 0xa1b23c4d) {
        swap = false;
    } else if (magic == 0xd4c3b2a1 || magic == 0x4d3cb2a1) {
        swap = true;
    } else {
        std::cerr << "pcap_icrc_check: " << argv[1]
                  << ": not a classic pcap file (pcapng? capture with tcpdump -w)\n";
        return 2;
    }
    const uint32_t linktype = rd32(file.data() + 20, swap);
    size_t off = 24;
    long frames = 0, roce = 0, good = 0, bad = 0;
    while (off + 16 <= file.size()) {
        const uint32_t caplen = rd32(file.data() + off + 8, swap);
        const uint32_t origlen = rd32(file.data() + off + 12, swap);
        off += 16;
        if (off + caplen > file.size()) {
            break;
        }
        const uint8_t *f = file.data() + off;
        off += caplen;
        ++frames;
        const long ip = ipOffset(linktype, f, caplen);
        if (ip < 0 || caplen < static_cast<size_t>(ip) + kIpv4UdpBytes) {
            continue;
        }
        const uint8_t *iph = f + ip;
        if ((iph[0] >> 4) != 4 || (iph[0] & 0xf) != 5 || iph[9] != 17) {
            continue;  // IPv4 without options, UDP only
        }
        const uint16_t dport = static_cast<uint16_t>((iph[22] << 8) | iph[23]);
        if (dport != kRoceV2Port) {
            continue;
        }
        const size_t udp_len = static_cast<size_t>((iph[24] << 8) | iph[25]);
        if (caplen != origlen || udp_len < 8 + kBthBytes + kIcrcBytes ||
            static_cast<size_t>(ip) + 20 + udp_len > caplen) {
            std::cerr << "frame " << frames << ": truncated capture (use tcpdump -s 0)\n";
            ++bad;
            continue;
        }
        ++roce;
        const uint8_t *bth = iph + kIpv4UdpBytes;
        const size_t len = udp_len - 8 - kIcrcBytes;
        uint8_t want[4];
        icrcStore(icrcOf(iph, bth, len), want);
        const bool ok = std::memcmp(want, bth + len, 4) == 0;
        ok ? ++good : ++bad;
        if (verbose || !ok) {
            const OpcodeInfo *info = opcodeInfo(bth[0]);
            std::printf("frame %ld: %s psn %u icrc %02x%02x%02x%02x %s\n", frames,
                        info != nullptr ? info->name : "opcode?", readBth(bth).psn, bth[len],
                        bth[len + 1], bth[len + 2], bth[len + 3], ok ? "ok" : "BAD");
        }
    }
    std::printf("pcap_icrc_check: %ld frames, %ld RoCEv2, %ld ICRC ok, %ld bad\n", frames, roce,
                good, bad);
    return bad == 0 && roce > 0 ? 0 : 1;
}
