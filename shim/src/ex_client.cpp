// tl_write_msg and tl_write_group: the description (ExHeader, payload, entries) goes into a
// block of the client's arena, one kWriteEx request names it, and the ticket's hook copies the
// entries' statuses out and gives the block back when the ticket ends.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "client.hpp"
#include "tensorlane/ipc/status.hpp"

namespace tensorlane::shim {

namespace {

/// What every kWriteEx call checks of its options first.
bool validOpts(const tl_send_opts &o, std::string *why) {
    if (o.payload_bytes > ipc::kMaxPayload) {
        *why = "payload of " + std::to_string(o.payload_bytes) + " bytes (at most " +
               std::to_string(ipc::kMaxPayload) + ", TL_MAX_PAYLOAD)";
        return false;
    }
    if (o.payload_bytes != 0 && o.payload == nullptr) {
        *why = "payload_bytes without a payload";
        return false;
    }
    if (o.flags != 0 || o.reserved[0] != 0 || o.reserved[1] != 0) {
        *why = "flags and reserved must be 0";
        return false;
    }
    return true;
}

}  // namespace

tl_status Client::writeMsg(tl_region src, uint64_t src_off, tl_remote dst, uint64_t dst_off,
                           uint64_t bytes, const tl_send_opts *opts, tl_ticket *out) {
    if (!out) {
        return fail(Code::kInvalid, "tl_write_msg: out is NULL");
    }
    const tl_send_opts none{};
    if (opts == nullptr && bytes != 0) {
        // Nothing beyond tl_write: its own path.
        tl_write_desc w{src, src_off, dst, dst_off, bytes, 0, 0};
        return write(&w, 1, out, nullptr);
    }
    if (opts != nullptr && (opts->entry_status != nullptr || opts->notify != 0)) {
        return fail(Code::kInvalid,
                    "tl_write_msg: entry_status and notify are tl_write_group's options");
    }
    const tl_group_entry e{src, src_off, dst, dst_off, bytes};
    return submitEx(ipc::ExKind::kWrite, &e, bytes != 0 ? 1 : 0, dst, dst_off,
                    opts != nullptr ? *opts : none, "tl_write_msg", out);
}

tl_status Client::writeGroup(const tl_group_entry *entries, size_t n, const tl_send_opts *opts,
                             tl_ticket *out) {
    if (!out || !entries || n == 0) {
        return fail(Code::kInvalid, "tl_write_group: no entries or no ticket pointer");
    }
    if (n > ipc::kMaxGroupEntries) {
        return fail(Code::kInvalid, "tl_write_group: " + std::to_string(n) + " entries (at most " +
                                        std::to_string(ipc::kMaxGroupEntries) +
                                        ", TL_GROUP_MAX_ENTRIES)");
    }
    const tl_send_opts none{};
    const tl_send_opts &o = opts != nullptr ? *opts : none;
    const tl_remote notify = o.notify != 0 ? o.notify : entries[0].dst;
    const uint64_t notify_off = o.notify != 0 ? 0 : entries[0].dst_off;
    return submitEx(ipc::ExKind::kGroup, entries, n, notify, notify_off, o, "tl_write_group", out);
}

tl_status Client::submitEx(ipc::ExKind kind, const tl_group_entry *entries, size_t n,
                           tl_remote notify, uint64_t notify_off, const tl_send_opts &opts,
                           const char *what, tl_ticket *out) {
    std::string why;
    if (!validOpts(opts, &why)) {
        return fail(Code::kInvalid, std::string(what) + ": " + why);
    }
    // Wrong on its face fails here, and nothing is submitted; the sidecar checks it all again.
    uint64_t notify_bytes = 0;
    if (!regions_.remoteBytes(notify, &notify_bytes)) {
        return fail(Code::kInvalid, std::string(what) + ": unknown remote " +
                                        std::to_string(notify) + " (not from tl_lookup)");
    }
    if (notify_off > notify_bytes) {
        return fail(Code::kInvalid, std::string(what) + ": offset past the region's end");
    }
    std::vector<tl_write_desc> check(n);
    for (size_t i = 0; i < n; ++i) {
        const tl_group_entry &e = entries[i];
        check[i] = tl_write_desc{e.src, e.src_off, e.dst, e.dst_off, e.bytes, 0, 0};
    }
    size_t bad = 0;
    if (n != 0 && !regions_.checkWrites(check.data(), n, &bad, &why)) {
        return fail(Code::kInvalid,
                    kind == ipc::ExKind::kGroup
                        ? std::string(what) + ": entry " + std::to_string(bad) + ": " + why
                        : std::string(what) + ": " + why);
    }
    const auto count = static_cast<uint32_t>(n);
    const uint64_t len = ipc::exDescriptionBytes(count, opts.payload_bytes);
    ExArena::Block block;
    if (tl_status st = ex_arena_.take(len, &block); st != TL_OK) {
        return st;
    }
    ipc::ExHeader h{};
    h.magic = ipc::kExMagic;
    h.kind = static_cast<uint32_t>(kind);
    h.entries = count;
    h.payload_bytes = opts.payload_bytes;
    h.timeout_ms = std::max(opts.timeout_ms, 0);
    h.notify = notify;
    h.notify_offset = notify_off;
    std::memcpy(block.ptr, &h, sizeof h);
    if (opts.payload_bytes != 0) {
        std::memcpy(block.ptr + sizeof h, opts.payload, opts.payload_bytes);
    }
    auto *ex = reinterpret_cast<ipc::ExEntry *>(block.ptr + ipc::exEntriesOffset(h.payload_bytes));
    for (uint32_t i = 0; i < count; ++i) {
        const tl_group_entry &e = entries[i];
        ex[i] = ipc::ExEntry{e.src, e.src_off, e.dst, e.dst_off, e.bytes, -1, 0};
    }
    ipc::Request r{};
    r.op = static_cast<uint8_t>(ipc::Op::kWriteEx);
    r.imm = opts.imm;
    r.src_region = block.region;
    r.src_offset = block.offset;
    r.bytes = len;
    // When the ticket ends: the entries' statuses (the sidecar wrote each before the
    // completion; one it did not reach ends with the ticket's), then the block goes back.
    Rings::TicketHook hook = [this, block, ex, count, user = opts.entry_status](int32_t status) {
        if (user != nullptr) {
            for (uint32_t i = 0; i < count; ++i) {
                const int32_t s = ex[i].status;
                user[i] = static_cast<tl_status>(s >= 0 ? ipc::sanitizeCode(s)
                                                        : ipc::sanitizeCode(status));
            }
        }
        ex_arena_.give(block);
    };
    size_t submitted = 0;
    const tl_status st = rings_.submit(&r, 1, out, &submitted, nullptr, &hook);
    if (submitted == 0) {
        ex_arena_.give(block);  // the hook never went to a ticket
    }
    return st;
}

}  // namespace tensorlane::shim
