#include "headers.hpp"

namespace tensorlane::simhca {

void writeBe32(uint8_t *p, uint32_t v) {
    p[0] = static_cast<uint8_t>(v >> 24);
    p[1] = static_cast<uint8_t>(v >> 16);
    p[2] = static_cast<uint8_t>(v >> 8);
    p[3] = static_cast<uint8_t>(v);
}

uint32_t readBe32(const uint8_t *p) {
    return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// BTH layout (IB spec Figure 99): opcode | SE M Pad(2) TVer(4) | P_Key(16) | F B Resv6 |
// DestQP(24) | A Resv7 | PSN(24). TVer is 0 for this version of the spec.
void writeBth(uint8_t *p, const Bth &bth) {
    p[0] = bth.opcode;
    p[1] = static_cast<uint8_t>((bth.solicited ? 0x80 : 0) | (bth.mig_req ? 0x40 : 0) |
                                ((bth.pad & 3) << 4));
    p[2] = static_cast<uint8_t>(bth.pkey >> 8);
    p[3] = static_cast<uint8_t>(bth.pkey);
    writeBe32(p + 4, (bth.dest_qpn & kQpnMask) | (bth.fecn ? 0x80000000u : 0) |
                         (bth.becn ? 0x40000000u : 0));
    writeBe32(p + 8, (bth.psn & kPsnMask) | (bth.ack_req ? 0x80000000u : 0));
}

Bth readBth(const uint8_t *p) {
    Bth bth;
    bth.opcode = p[0];
    bth.solicited = (p[1] & 0x80) != 0;
    bth.mig_req = (p[1] & 0x40) != 0;
    bth.pad = (p[1] >> 4) & 3;
    bth.pkey = static_cast<uint16_t>((p[2] << 8) | p[3]);
    const uint32_t w1 = readBe32(p + 4);
    bth.fecn = (w1 & 0x80000000u) != 0;
    bth.becn = (w1 & 0x40000000u) != 0;
    bth.dest_qpn = w1 & kQpnMask;
    const uint32_t w2 = readBe32(p + 8);
    bth.ack_req = (w2 & 0x80000000u) != 0;
    bth.psn = w2 & kPsnMask;
    return bth;
}

void writeReth(uint8_t *p, const Reth &reth) {
    writeBe32(p, static_cast<uint32_t>(reth.va >> 32));
    writeBe32(p + 4, static_cast<uint32_t>(reth.va));
    writeBe32(p + 8, reth.rkey);
    writeBe32(p + 12, reth.dma_len);
}

Reth readReth(const uint8_t *p) {
    Reth reth;
    reth.va = (uint64_t{readBe32(p)} << 32) | readBe32(p + 4);
    reth.rkey = readBe32(p + 8);
    reth.dma_len = readBe32(p + 12);
    return reth;
}

void writeAeth(uint8_t *p, const Aeth &aeth) {
    writeBe32(p, (uint32_t{aeth.syndrome} << 24) | (aeth.msn & kPsnMask));
}

Aeth readAeth(const uint8_t *p) {
    const uint32_t w = readBe32(p);
    return Aeth{static_cast<uint8_t>(w >> 24), w & kPsnMask};
}

}  // namespace tensorlane::simhca
