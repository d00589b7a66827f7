#include "ex_message.hpp"

#include "net/frame.hpp"
#include "tensorlane/ipc/status.hpp"

namespace tensorlane::sidecar {

std::vector<uint8_t> encodeExMessage(const ExMessage &m) {
    std::vector<uint8_t> out(kExMessageHeaderBytes + m.payload.size(), 0);
    uint8_t *p = out.data();
    p[0] = 1;
    p[1] = static_cast<uint8_t>(m.record);
    p[2] = static_cast<uint8_t>(m.notify);
    storeLe32(p + 4, static_cast<uint32_t>(m.status));
    storeLe32(p + 8, m.entries);
    storeLe32(p + 12, m.timeout_ms);
    storeLe64(p + 16, m.group);
    storeLe64(p + 24, m.offset);
    storeLe64(p + 32, m.bytes);
    storeLe16(p + 40, static_cast<uint16_t>(m.payload.size()));
    std::copy(m.payload.begin(), m.payload.end(), p + kExMessageHeaderBytes);
    return out;
}

bool decodeExMessage(std::span<const uint8_t> bytes, ExMessage *out, std::string *why) {
    if (bytes.size() < kExMessageHeaderBytes) {
        *why = "a record of " + std::to_string(bytes.size()) + " bytes";
        return false;
    }
    const uint8_t *p = bytes.data();
    if (p[0] != 1) {
        *why = "record version " + std::to_string(p[0]);
        return false;
    }
    if (p[1] < 1 || p[1] > 3 || p[2] > 2 || p[3] != 0) {
        *why = "unknown record kind";
        return false;
    }
    const uint16_t len = loadLe16(p + 40);
    if (len > ipc::kMaxPayload || bytes.size() != kExMessageHeaderBytes + len ||
        loadLe16(p + 42) != 0 || loadLe32(p + 44) != 0) {
        *why = "payload length " + std::to_string(len) + " in a record of " +
               std::to_string(bytes.size()) + " bytes";
        return false;
    }
    ExMessage m;
    m.record = static_cast<ExRecord>(p[1]);
    m.notify = static_cast<ipc::NotifyKind>(p[2]);
    m.status = static_cast<int32_t>(loadLe32(p + 4));
    m.entries = loadLe32(p + 8);
    m.timeout_ms = loadLe32(p + 12);
    m.group = loadLe64(p + 16);
    m.offset = loadLe64(p + 24);
    m.bytes = loadLe64(p + 32);
    if (m.entries > ipc::kMaxGroupEntries ||
        static_cast<int32_t>(ipc::sanitizeCode(m.status)) != m.status) {
        *why = "entry count or status out of range";
        return false;
    }
    m.payload.assign(p + kExMessageHeaderBytes, p + kExMessageHeaderBytes + len);
    *out = std::move(m);
    return true;
}

}  // namespace tensorlane::sidecar
