// The wire format alone: headers, opcode table, ICRC against a packet captured from real
// hardware, parser checks, the mask table, the RoCE active MTU rule and the UDP source port.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "device_info.hpp"
#include "headers.hpp"
#include "icrc.hpp"
#include "opcode.hpp"
#include "packet_parser.hpp"
#include "psn.hpp"
#include "qp_state_table.hpp"
#include "tx_path.hpp"

namespace tensorlane::simhca {
namespace {

std::vector<uint8_t> hex(const char *s) {
    std::vector<uint8_t> out;
    for (; s[0] != '\0' && s[1] != '\0'; s += 2) {
        if (s[0] == ' ') {
            --s;
            continue;
        }
        out.push_back(static_cast<uint8_t>(std::stoi(std::string(s, 2), nullptr, 16)));
    }
    return out;
}

// A RoCEv2 CNP captured on a ConnectX-4 Lx (published with scapy's RoCE layer tests,
// test/contrib/roce.uts): Ethernet, IPv4 (TOS 0xc2, id 0x718c, DF), UDP, BTH, 16 bytes of
// padding and the ICRC the NIC computed, 82 fd 00 2a.
TEST(Icrc, MatchesAConnectX4Capture) {
    const auto frame =
        hex("e41d2dab2bc27cfe90643b320800"
            "45c2003c718c400040119161 0a001101 0a001201"
            "000012b700280000"
            "8100ffff4000011800000000"
            "00000000000000000000000000000000"
            "82fd002a");
    const uint8_t *ip_udp = frame.data() + 14;
    const uint8_t *bth = ip_udp + kIpv4UdpBytes;
    const size_t len = frame.size() - 14 - kIpv4UdpBytes - kIcrcBytes;
    uint8_t got[4];
    icrcStore(icrcOf(ip_udp, bth, len), got);
    EXPECT_EQ(std::memcmp(got, frame.data() + frame.size() - 4, 4), 0);
}

TEST(Icrc, VariantFieldsDoNotMatter) {
    uint8_t ip_udp[kIpv4UdpBytes];
    Ipv4UdpFlow flow{0x7f000002, 0x7f000003, 0xc123, kRoceV2Port};
    std::vector<uint8_t> pkt(kBthBytes + 8, 0x42);
    buildIpv4UdpHeader(ip_udp, flow, pkt.size() + 4);
    const uint32_t a = icrcOf(ip_udp, pkt.data(), pkt.size());
    ip_udp[1] = 0x6a;   // TOS (DSCP 26, ECT(0))
    ip_udp[8] = 3;      // TTL
    ip_udp[10] = 0x12;  // IP checksum
    ip_udp[27] = 0x34;  // UDP checksum
    pkt[4] |= 0xc0;     // FECN/BECN in resv8a
    EXPECT_EQ(icrcOf(ip_udp, pkt.data(), pkt.size()), a);
    ip_udp[5] ^= 1;  // the IPv4 id is covered
    EXPECT_NE(icrcOf(ip_udp, pkt.data(), pkt.size()), a);
}

TEST(Headers, RoundTrip) {
    Bth bth;
    bth.opcode = 0x0b;
    bth.solicited = true;
    bth.pad = 3;
    bth.dest_qpn = 0xabcdef;
    bth.ack_req = true;
    bth.psn = 0xfffffe;
    uint8_t buf[kBthBytes + kRethBytes + kAethBytes];
    writeBth(buf, bth);
    const Bth back = readBth(buf);
    EXPECT_EQ(back.opcode, 0x0b);
    EXPECT_TRUE(back.solicited);
    EXPECT_EQ(back.pad, 3);
    EXPECT_EQ(back.pkey, 0xffff);
    EXPECT_EQ(back.dest_qpn, 0xabcdefu);
    EXPECT_TRUE(back.ack_req);
    EXPECT_EQ(back.psn, 0xfffffeu);
    writeReth(buf + kBthBytes, Reth{0x1122334455667788ull, 0x99aabbcc, 4096});
    const Reth r = readReth(buf + kBthBytes);
    EXPECT_EQ(r.va, 0x1122334455667788ull);
    EXPECT_EQ(r.rkey, 0x99aabbccu);
    EXPECT_EQ(r.dma_len, 4096u);
    writeAeth(buf + kBthBytes + kRethBytes, Aeth{kAethRnrNak | 12, 0x123456});
    const Aeth a = readAeth(buf + kBthBytes + kRethBytes);
    EXPECT_EQ(a.syndrome, kAethRnrNak | 12);
    EXPECT_EQ(a.msn, 0x123456u);
}

TEST(Opcodes, TableAsTheSpec) {
    EXPECT_EQ(opcodeInfo(0x0a)->header_bytes, kBthBytes + kRethBytes);
    EXPECT_EQ(opcodeInfo(0x0b)->header_bytes, kBthBytes + kRethBytes + kImmBytes);
    EXPECT_TRUE(opcodeInfo(0x0b)->flags & kConsumesRecv);
    EXPECT_FALSE(opcodeInfo(0x0a)->flags & kConsumesRecv);
    EXPECT_TRUE(opcodeInfo(0x09)->flags & kConsumesRecv);
    EXPECT_EQ(opcodeInfo(0x11)->header_bytes, kBthBytes + kAethBytes);
    EXPECT_EQ(opcodeInfo(0x0e)->header_bytes, kBthBytes);
    EXPECT_EQ(opcodeInfo(0x12), nullptr);  // atomic ACK: not modelled
    EXPECT_EQ(opcodeInfo(0x64), nullptr);  // UD
    EXPECT_EQ(opcodeInfo(0x81), nullptr);  // CNP
}

TEST(Parser, RejectsWhatIsMalformed) {
    Ipv4UdpFlow flow{0x7f000002, 0x7f000003, 0xc000, kRoceV2Port};
    Packet pkt;
    std::vector<uint8_t> p(kBthBytes + 4 + kIcrcBytes, 0);
    Bth bth;
    bth.opcode = 0x04;  // SEND ONLY
    writeBth(p.data(), bth);
    uint8_t ip_udp[kIpv4UdpBytes];
    buildIpv4UdpHeader(ip_udp, flow, p.size());
    icrcStore(icrcOf(ip_udp, p.data(), p.size() - 4), p.data() + p.size() - 4);
    EXPECT_EQ(parsePacket(p.data(), p.size(), flow, true, pkt), ParseResult::kOk);
    EXPECT_EQ(pkt.payload_len, 4u);
    EXPECT_EQ(parsePacket(p.data(), 10, flow, true, pkt), ParseResult::kTruncated);
    auto bad = p;
    bad[14] ^= 1;
    EXPECT_EQ(parsePacket(bad.data(), bad.size(), flow, true, pkt), ParseResult::kBadIcrc);
    bad = p;
    bad[1] |= 0x30;  // pad 3 > payload? payload is 4: allowed, but ICRC no longer matches
    EXPECT_NE(parsePacket(bad.data(), bad.size(), flow, true, pkt), ParseResult::kOk);
    bad = p;
    bad[1] |= 0x01;  // TVer 1
    EXPECT_EQ(parsePacket(bad.data(), bad.size(), flow, false, pkt), ParseResult::kBadTver);
    bad = p;
    bad[0] = 0x11;  // an ACK needs an AETH
    EXPECT_EQ(parsePacket(bad.data(), kBthBytes + 2 + 4, flow, false, pkt),
              ParseResult::kTruncated);
    bad = p;
    bad[0] = 0x13;
    EXPECT_EQ(parsePacket(bad.data(), bad.size(), flow, false, pkt), ParseResult::kUnknownOpcode);
}

TEST(Psn, TwentyFourBitArithmetic) {
    EXPECT_EQ(psnAdd(0xffffff, 1), 0u);
    EXPECT_EQ(psnDiff(0, 0xffffff), 1);
    EXPECT_EQ(psnDiff(0xffffff, 0), -1);
    EXPECT_EQ(psnDiff(5, 3), 2);
}

TEST(MaskTable, KernelSpotChecks) {
    const int rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    EXPECT_TRUE(modifyQpIsOk(IBV_QPS_INIT, IBV_QPS_RTR, rtr));
    EXPECT_FALSE(modifyQpIsOk(IBV_QPS_INIT, IBV_QPS_RTR, rtr & ~IBV_QP_MIN_RNR_TIMER));
    EXPECT_FALSE(modifyQpIsOk(IBV_QPS_INIT, IBV_QPS_RTR, rtr | IBV_QP_SQ_PSN));
    EXPECT_FALSE(modifyQpIsOk(IBV_QPS_RESET, IBV_QPS_ERR, IBV_QP_STATE));
    EXPECT_TRUE(modifyQpIsOk(IBV_QPS_ERR, IBV_QPS_RESET, IBV_QP_STATE));
    EXPECT_FALSE(modifyQpIsOk(IBV_QPS_INIT, IBV_QPS_RTS, IBV_QP_STATE));
    EXPECT_FALSE(modifyQpIsOk(IBV_QPS_INIT, IBV_QPS_INIT, IBV_QP_STATE | IBV_QP_CUR_STATE));
}

TEST(Roce, ActiveMtuAndSourcePort) {
    EXPECT_EQ(roceActiveMtu(1500), IBV_MTU_1024);
    EXPECT_EQ(roceActiveMtu(4192), IBV_MTU_4096);
    EXPECT_EQ(roceActiveMtu(4191), IBV_MTU_2048);
    EXPECT_EQ(roceActiveMtu(9000), IBV_MTU_4096);
    // 0xc000 | hash_32(qpn, 14): always in the dynamic range, and QPs spread.
    EXPECT_GE(roceSourcePort(0x11), 0xc000);
    EXPECT_NE(roceSourcePort(0x11), roceSourcePort(0x12));
}

}  // namespace
}  // namespace tensorlane::simhca
