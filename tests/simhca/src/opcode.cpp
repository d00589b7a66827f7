#include "opcode.hpp"

#include <array>

#include "headers.hpp"

namespace tensorlane::simhca {
namespace {

constexpr uint8_t kB = kBthBytes;
constexpr uint8_t kR = kRethBytes;
constexpr uint8_t kA = kAethBytes;
constexpr uint8_t kI = kImmBytes;

constexpr uint32_t kSendReq = kIsRequest | kIsSend | kHasPayload;
constexpr uint32_t kWriteReq = kIsRequest | kIsWrite | kHasPayload;
constexpr uint32_t kReadResp = kIsResponse | kIsRead | kHasPayload;

// Indexed by the opcode value; RC occupies 0x00-0x1f (IB spec Table 38). Rows left empty are
// opcodes not modelled (atomics 0x12-0x14, invalidate 0x16-0x17, UC/RD/UD/XRC ranges).
constexpr std::array<OpcodeInfo, 0x20> kOpcodes = [] {
    std::array<OpcodeInfo, 0x20> t{};
    auto set = [&t](Opcode op, const char *name, uint32_t flags, uint8_t bytes) {
        t[static_cast<uint8_t>(op)] = OpcodeInfo{name, flags, bytes};
    };
    set(Opcode::kSendFirst, "RC Send First", kSendReq | kIsFirst | kConsumesRecv, kB);
    set(Opcode::kSendMiddle, "RC Send Middle", kSendReq | kIsMiddle, kB);
    set(Opcode::kSendLast, "RC Send Last", kSendReq | kIsLast, kB);
    set(Opcode::kSendLastWithImm, "RC Send Last Immediate", kSendReq | kIsLast | kHasImm, kB + kI);
    set(Opcode::kSendOnly, "RC Send Only", kSendReq | kIsFirst | kIsLast | kConsumesRecv, kB);
    set(Opcode::kSendOnlyWithImm, "RC Send Only Immediate",
        kSendReq | kIsFirst | kIsLast | kHasImm | kConsumesRecv, kB + kI);
    set(Opcode::kWriteFirst, "RC RDMA Write First", kWriteReq | kIsFirst | kHasReth, kB + kR);
    set(Opcode::kWriteMiddle, "RC RDMA Write Middle", kWriteReq | kIsMiddle, kB);
    set(Opcode::kWriteLast, "RC RDMA Write Last", kWriteReq | kIsLast, kB);
    set(Opcode::kWriteLastWithImm, "RC RDMA Write Last Immediate",
        kWriteReq | kIsLast | kHasImm | kConsumesRecv, kB + kI);
    set(Opcode::kWriteOnly, "RC RDMA Write Only", kWriteReq | kIsFirst | kIsLast | kHasReth,
        kB + kR);
    set(Opcode::kWriteOnlyWithImm, "RC RDMA Write Only Immediate",
        kWriteReq | kIsFirst | kIsLast | kHasReth | kHasImm | kConsumesRecv, kB + kR + kI);
    set(Opcode::kReadRequest, "RC RDMA Read Request",
        kIsRequest | kIsRead | kIsFirst | kIsLast | kHasReth, kB + kR);
    set(Opcode::kReadResponseFirst, "RC RDMA Read Response First", kReadResp | kIsFirst | kHasAeth,
        kB + kA);
    set(Opcode::kReadResponseMiddle, "RC RDMA Read Response Middle", kReadResp | kIsMiddle, kB);
    set(Opcode::kReadResponseLast, "RC RDMA Read Response Last", kReadResp | kIsLast | kHasAeth,
        kB + kA);
    set(Opcode::kReadResponseOnly, "RC RDMA Read Response Only",
        kReadResp | kIsFirst | kIsLast | kHasAeth, kB + kA);
    set(Opcode::kAcknowledge, "RC Acknowledge", kIsResponse | kHasAeth | kIsFirst | kIsLast,
        kB + kA);
    return t;
}();

}  // namespace

const OpcodeInfo *opcodeInfo(uint8_t opcode) {
    if (opcode >= kOpcodes.size() || kOpcodes[opcode].name == nullptr) {
        return nullptr;
    }
    return &kOpcodes[opcode];
}

}  // namespace tensorlane::simhca
