#include "tensorlane/ipc/layout.hpp"

#include <cstring>

#include "tensorlane/ipc/control.hpp"

namespace tensorlane::ipc {

void initSegment(void *base, const SegmentGeometry &g, uint64_t session_id) {
    auto *h = static_cast<SegmentHeader *>(base);
    h->version = kLayoutVersion;
    h->header_bytes = sizeof(SegmentHeader);
    h->total_bytes = g.total_bytes;
    h->session_id = session_id;
    h->request_depth = g.request_depth;
    h->completion_depth = g.completion_depth;
    h->notification_depth = g.notification_depth;
    h->request_offset = g.request_offset;
    h->completion_offset = g.completion_offset;
    h->notification_offset = g.notification_offset;
    h->payload_offset = g.payload_offset;
    h->sidecar_sleeping.value.store(0, std::memory_order_relaxed);
    h->client_waiting.value.store(0, std::memory_order_relaxed);
    // Ring cursors are zero because the segment is fresh from ftruncate.
    // SYNC POINT: magic last, with release, so a client that acquire-loads the magic sees every
    // field above (the client maps only after receiving the fd, but the rule costs nothing).
    h->magic.store(kSegmentMagic, std::memory_order_release);
}

bool validateSegment(const void *base, uint64_t mapped_bytes, SegmentGeometry *out) {
    if (mapped_bytes < sizeof(SegmentHeader)) {
        return false;
    }
    const auto *h = static_cast<const SegmentHeader *>(base);
    // SYNC POINT: acquire pairs with initSegment's release store of magic.
    if (h->magic.load(std::memory_order_acquire) != kSegmentMagic) {
        return false;
    }
    if (h->version != kLayoutVersion || h->header_bytes != sizeof(SegmentHeader) ||
        !isValidRingDepth(h->request_depth)) {
        return false;
    }
    SegmentGeometry g = SegmentGeometry::forDepth(h->request_depth);
    if (h->completion_depth != g.completion_depth ||
        h->notification_depth != g.notification_depth || h->request_offset != g.request_offset ||
        h->completion_offset != g.completion_offset ||
        h->notification_offset != g.notification_offset || h->payload_offset != g.payload_offset ||
        h->total_bytes != g.total_bytes || g.total_bytes > mapped_bytes) {
        return false;
    }
    *out = g;
    return true;
}

void initStreamSegment(void *base, const StreamGeometry &g) {
    auto *h = static_cast<StreamSegmentHeader *>(base);
    h->version = kLayoutVersion;
    h->ticket_slots = g.ticket_slots;
    h->notify_slots = g.notify_slots;
    h->ticket_offset = g.ticket_offset;
    h->notify_offset = g.notify_offset;
    h->total_bytes = g.total_bytes;
    // The slots are zero because the segment is fresh from ftruncate.
    // SYNC POINT: magic last, with release (as initSegment).
    h->magic.store(kStreamSegmentMagic, std::memory_order_release);
}

bool validateStreamSegment(const void *base, uint64_t mapped_bytes, uint32_t ring_depth,
                           StreamGeometry *out) {
    if (mapped_bytes < sizeof(StreamSegmentHeader) || !isValidRingDepth(ring_depth)) {
        return false;
    }
    const auto *h = static_cast<const StreamSegmentHeader *>(base);
    // SYNC POINT: acquire pairs with initStreamSegment's release store of magic.
    if (h->magic.load(std::memory_order_acquire) != kStreamSegmentMagic) {
        return false;
    }
    const StreamGeometry g = StreamGeometry::forDepth(ring_depth);
    if (h->version != kLayoutVersion || h->ticket_slots != g.ticket_slots ||
        h->notify_slots != g.notify_slots || h->ticket_offset != g.ticket_offset ||
        h->notify_offset != g.notify_offset || h->total_bytes != g.total_bytes ||
        g.total_bytes > mapped_bytes) {
        return false;
    }
    *out = g;
    return true;
}

void copyName(char *dst, size_t dst_bytes, const char *src) {
    if (dst_bytes == 0) {
        return;
    }
    size_t n = src ? strnlen(src, dst_bytes - 1) : 0;
    std::memcpy(dst, src ? src : "", n);
    std::memset(dst + n, 0, dst_bytes - n);
}

bool readName(const char *field, size_t field_bytes, const char **out) {
    size_t n = strnlen(field, field_bytes);
    if (n == 0 || n == field_bytes) {
        return false;
    }
    *out = field;
    return true;
}

}  // namespace tensorlane::ipc
