// The engine's own records inside WriteOp::message (transport.hpp): what a kWriteEx request
// (ipc/layout.hpp) sends to the target engine besides its data. Transports carry these bytes
// verbatim and in order with the writes of the same peer; the target engine decodes them and
// treats them as hostile input (a peer, or a forged local client, may send anything).
//
//   kPayload     after a tl_write_msg's data (or alone): notify the owner with the payload.
//   kGroupBegin  before a group's entries (and before the data of a write with a deadline):
//                the target starts watching it: its deadline (plus kGroupGraceMs) and the
//                session it came over, so a writer that falls silent or dies still ends it.
//   kGroupEnd    once every entry ended at the writer: notify the owner with the group's
//                status (kOk, or the first failure, or kTimedOut at the deadline).
//
// Layout (little-endian): version u8 (1), kind u8, notify kind u8, 0 u8, status i32, entries
// u32, timeout_ms u32, group u64, offset u64, bytes u64, payload length u16, 0 u16, 0 u32,
// then the payload.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tensorlane/ipc/layout.hpp"

namespace tensorlane::sidecar {

enum class ExRecord : uint8_t { kPayload = 1, kGroupBegin = 2, kGroupEnd = 3 };

struct ExMessage {
    ExRecord record = ExRecord::kPayload;
    ipc::NotifyKind notify = ipc::NotifyKind::kWrite;  ///< what the owner's notification says
    int32_t status = 0;                                ///< kGroupEnd: a Code
    uint32_t entries = 0;
    uint32_t timeout_ms = 0;  ///< kGroupBegin: 0, or the writer's deadline
    uint64_t group = 0;       ///< kGroupBegin/kGroupEnd: the writer engine's id for it
    uint64_t offset = 0;      ///< the notification's offset and bytes
    uint64_t bytes = 0;
    std::vector<uint8_t> payload;  ///< at most ipc::kMaxPayload
};

inline constexpr size_t kExMessageHeaderBytes = 48;
/// How long past a group's deadline the target waits for the writer's kGroupEnd before it
/// ends the group itself (the writer, whose clock started first, normally ends it).
inline constexpr uint32_t kGroupGraceMs = 250;

std::vector<uint8_t> encodeExMessage(const ExMessage &m);
/// False with `*why` for anything malformed.
bool decodeExMessage(std::span<const uint8_t> bytes, ExMessage *out, std::string *why);

}  // namespace tensorlane::sidecar
