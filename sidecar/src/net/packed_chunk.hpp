// Packed chunks: one CHUNK frame of a scattered write (a grouped write's entries) that carries
// several small extents. A group of a thousand 16 KiB entries sent one chunk per entry paid
// per chunk for its frame, its tag job, its staging slot and its wake-ups, and took 2.3x a
// single write of the same bytes on the 16-core GPU machine; packed, it pays that per
// megabyte as a single write does.
//
// The chunk's data is a table, then the extents' bytes in table order:
//   pieces x { u64 dst_offset, u64 bytes }     (little-endian; the count is the chunk
//                                               header's write_offset)
//   the bytes of piece 0, piece 1, ...
// The table is read only after the chunk's tag has verified, and checked whole before any
// byte is copied: every piece non-empty and inside the region, and their bytes filling the
// rest of the chunk exactly. A bad table lands nothing (the write fails with kNotFound).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "net/frame.hpp"

namespace tensorlane::sidecar {

inline constexpr size_t kPackedEntryBytes = 16;
/// Most extents in one packed chunk (a 4 KiB table).
inline constexpr uint32_t kMaxPackedPieces = 256;

inline constexpr size_t packedTableBytes(uint32_t pieces) {
    return kPackedEntryBytes * pieces;
}

inline void encodePackedEntry(uint8_t *table, uint32_t i, uint64_t dst_offset, uint64_t bytes) {
    storeLe64(table + kPackedEntryBytes * i, dst_offset);
    storeLe64(table + kPackedEntryBytes * i + 8, bytes);
}

/// Checks the table of a packed chunk of `len` data bytes with `pieces` entries against a
/// region of `region_bytes`. Calls `fn(dst_offset, data_offset, bytes)` for each piece once
/// the whole table is good (data_offset: where its bytes start in the chunk's data). False,
/// and no call, when it is not.
template <class Fn>
bool forEachPackedPiece(const uint8_t *data, size_t len, uint32_t pieces, uint64_t region_bytes,
                        Fn &&fn) {
    if (pieces == 0 || pieces > kMaxPackedPieces || len <= packedTableBytes(pieces)) {
        return false;
    }
    const uint64_t payload = len - packedTableBytes(pieces);
    uint64_t sum = 0;
    for (uint32_t i = 0; i < pieces; ++i) {
        const uint64_t dst = loadLe64(data + kPackedEntryBytes * i);
        const uint64_t bytes = loadLe64(data + kPackedEntryBytes * i + 8);
        if (bytes == 0 || bytes > payload - sum || bytes > region_bytes ||
            dst > region_bytes - bytes) {
            return false;
        }
        sum += bytes;
    }
    if (sum != payload) {
        return false;
    }
    uint64_t at = packedTableBytes(pieces);
    for (uint32_t i = 0; i < pieces; ++i) {
        const uint64_t bytes = loadLe64(data + kPackedEntryBytes * i + 8);
        fn(loadLe64(data + kPackedEntryBytes * i), at, bytes);
        at += bytes;
    }
    return true;
}

/// Copies a packed chunk's pieces into the region at `base` (of `region_bytes`); false, and
/// nothing copied, when its table is bad.
inline bool landPacked(uint8_t *base, uint64_t region_bytes, const uint8_t *data, size_t len,
                       uint32_t pieces) {
    return forEachPackedPiece(data, len, pieces, region_bytes,
                              [&](uint64_t dst, uint64_t at, uint64_t bytes) {
                                  std::memcpy(base + dst, data + at, bytes);
                              });
}

}  // namespace tensorlane::sidecar
