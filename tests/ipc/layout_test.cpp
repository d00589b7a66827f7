// Unit tests of the segment layout: geometry for every legal depth, and validation of a header
// that the other side may have scribbled on.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "tensorlane/ipc/layout.hpp"

namespace tensorlane::ipc {
namespace {

/// A zeroed, page-aligned anonymous mapping (what ftruncate gives the sidecar).
class Buffer {
public:
    explicit Buffer(size_t bytes) : bytes_(bytes) {
        void *p =
            ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        base_ = p == MAP_FAILED ? nullptr : p;
    }
    Buffer(const Buffer &) = delete;
    Buffer &operator=(const Buffer &) = delete;
    ~Buffer() {
        if (base_) {
            ::munmap(base_, bytes_);
        }
    }
    void *data() const { return base_; }
    SegmentHeader *header() const { return static_cast<SegmentHeader *>(base_); }

private:
    size_t bytes_;
    void *base_;
};

std::vector<uint32_t> allValidDepths() {
    std::vector<uint32_t> out;
    for (uint32_t d = kMinRingDepth; d <= kMaxRingDepth; d *= 2) {
        out.push_back(d);
    }
    return out;
}

TEST(Layout, StructSizesAreFixed) {
    EXPECT_EQ(sizeof(SegmentHeader), 256u);
    EXPECT_EQ(sizeof(RingControl), 128u);
    EXPECT_EQ(offsetof(RingControl, tail), 64u);
    EXPECT_EQ(sizeof(Request), 64u);
    EXPECT_EQ(sizeof(Completion), 32u);
    EXPECT_EQ(sizeof(Notification), 128u);
    EXPECT_EQ(offsetof(SegmentHeader, client_waiting), 192u);
}

TEST(Layout, RingDepthValidity) {
    EXPECT_TRUE(isValidRingDepth(16));
    EXPECT_TRUE(isValidRingDepth(1024));
    EXPECT_TRUE(isValidRingDepth(65536));
    EXPECT_FALSE(isValidRingDepth(0));
    EXPECT_FALSE(isValidRingDepth(8));
    EXPECT_FALSE(isValidRingDepth(24));
    EXPECT_FALSE(isValidRingDepth(1000));
    EXPECT_FALSE(isValidRingDepth(131072));
    EXPECT_FALSE(isValidRingDepth(0x80000000u));
}

TEST(Layout, GeometryIsAlignedRoundedAndDisjoint) {
    for (uint32_t d : allValidDepths()) {
        SCOPED_TRACE(d);
        const SegmentGeometry g = SegmentGeometry::forDepth(d);
        EXPECT_EQ(g.request_depth, d);
        EXPECT_EQ(g.completion_depth, d);
        EXPECT_EQ(g.notification_depth, d);
        for (uint64_t off : {g.request_offset, g.completion_offset, g.notification_offset}) {
            EXPECT_EQ(off % kCacheLine, 0u);
            // The slots after each RingControl are cache-line aligned too.
            EXPECT_EQ((off + sizeof(RingControl)) % kCacheLine, 0u);
        }
        EXPECT_EQ(g.total_bytes % 4096, 0u);

        // [header][req ctl + slots][cmp ctl + slots][ntf ctl + slots][payload slab][padding
        // < page]
        const uint64_t req_end = g.request_offset + sizeof(RingControl) + uint64_t{d} * 64;
        const uint64_t cmp_end = g.completion_offset + sizeof(RingControl) + uint64_t{d} * 32;
        const uint64_t ntf_end = g.notification_offset + sizeof(RingControl) + uint64_t{d} * 128;
        EXPECT_GE(g.request_offset, sizeof(SegmentHeader));
        EXPECT_LE(req_end, g.completion_offset);
        EXPECT_LE(cmp_end, g.notification_offset);
        const uint64_t slab_end = g.payload_offset + uint64_t{d} * kPayloadSlotBytes;
        EXPECT_LE(ntf_end, g.payload_offset);
        EXPECT_EQ(g.payload_offset % kCacheLine, 0u);
        EXPECT_LE(slab_end, g.total_bytes);
        EXPECT_LT(g.total_bytes - slab_end, 4096u);
    }
}

TEST(Layout, GeometryIsAConstantExpression) {
    constexpr SegmentGeometry g = SegmentGeometry::forDepth(1024);
    static_assert(g.total_bytes % 4096 == 0);
    EXPECT_EQ(g.request_offset, sizeof(SegmentHeader));
}

TEST(Layout, InitThenValidateAccepts) {
    for (uint32_t d : allValidDepths()) {
        SCOPED_TRACE(d);
        const SegmentGeometry g = SegmentGeometry::forDepth(d);
        Buffer buf(g.total_bytes);
        ASSERT_NE(buf.data(), nullptr);
        initSegment(buf.data(), g, 0x1234 + d);

        SegmentGeometry got;
        ASSERT_TRUE(validateSegment(buf.data(), g.total_bytes, &got));
        EXPECT_EQ(got.request_depth, d);
        EXPECT_EQ(got.request_offset, g.request_offset);
        EXPECT_EQ(got.completion_offset, g.completion_offset);
        EXPECT_EQ(got.notification_offset, g.notification_offset);
        EXPECT_EQ(got.total_bytes, g.total_bytes);

        const SegmentHeader *h = buf.header();
        EXPECT_EQ(h->magic.load(), kSegmentMagic);
        EXPECT_EQ(h->version, kLayoutVersion);
        EXPECT_EQ(h->session_id, 0x1234u + d);
        EXPECT_EQ(h->sidecar_sleeping.value.load(), 0u);
        EXPECT_EQ(h->client_waiting.value.load(), 0u);

        // A larger mapping than needed is fine.
        ASSERT_TRUE(validateSegment(buf.data(), g.total_bytes + 4096, &got));

        // The typed views land where the geometry says, inside the mapping.
        SegmentView v = SegmentView::at(buf.data(), got);
        auto *b = static_cast<unsigned char *>(buf.data());
        EXPECT_EQ(reinterpret_cast<unsigned char *>(v.request_ctl), b + g.request_offset);
        EXPECT_EQ(reinterpret_cast<unsigned char *>(v.requests),
                  b + g.request_offset + sizeof(RingControl));
        EXPECT_EQ(reinterpret_cast<unsigned char *>(v.completion_ctl), b + g.completion_offset);
        EXPECT_LE(reinterpret_cast<unsigned char *>(v.notifications + d), b + g.total_bytes);
        EXPECT_EQ(v.request_ctl->head.value.load(), 0u);
        EXPECT_EQ(v.notification_ctl->tail.value.load(), 0u);
    }
}

/// Initialises a depth-64 segment, lets `damage` change it, and reports whether it validates.
bool validatesAfter(const std::function<void(SegmentHeader *)> &damage, uint64_t mapped_delta = 0) {
    const SegmentGeometry g = SegmentGeometry::forDepth(64);
    Buffer buf(g.total_bytes + 4096);
    initSegment(buf.data(), g, 7);
    damage(buf.header());
    SegmentGeometry out;
    out.total_bytes = 0xabcdef;
    bool ok = validateSegment(buf.data(), g.total_bytes + mapped_delta, &out);
    if (!ok) {
        EXPECT_EQ(out.total_bytes, 0xabcdefu) << "output written on failure";
    }
    return ok;
}

TEST(Layout, ValidateRejectsBadMagic) {
    EXPECT_TRUE(validatesAfter([](SegmentHeader *) {}));
    EXPECT_FALSE(validatesAfter([](SegmentHeader *h) { h->magic.store(0); }));
    EXPECT_FALSE(validatesAfter([](SegmentHeader *h) { h->magic.store(kSegmentMagic ^ 1); }));
    EXPECT_FALSE(validatesAfter([](SegmentHeader *h) { h->magic.store(~kSegmentMagic); }));
}

TEST(Layout, ValidateRejectsUnpublishedSegment) {
    const SegmentGeometry g = SegmentGeometry::forDepth(64);
    Buffer buf(g.total_bytes);
    SegmentGeometry out;
    EXPECT_FALSE(validateSegment(buf.data(), g.total_bytes, &out));  // all zero: no magic yet
}

TEST(Layout, ValidateRejectsWrongVersion) {
    EXPECT_FALSE(validatesAfter([](SegmentHeader *h) { h->version = kLayoutVersion + 1; }));
    EXPECT_FALSE(validatesAfter([](SegmentHeader *h) { h->version = 0; }));
    EXPECT_FALSE(validatesAfter([](SegmentHeader *h) { h->header_bytes = 128; }));
}

TEST(Layout, ValidateRejectsBadDepth) {
    for (uint32_t bad : {0u, 1u, 8u, 24u, 48u, 100u, 131072u, 0xffffffffu}) {
        SCOPED_TRACE(bad);
        EXPECT_FALSE(validatesAfter([bad](SegmentHeader *h) { h->request_depth = bad; }));
    }
    // A legal depth that disagrees with the rest of the header is a lie too.
    EXPECT_FALSE(validatesAfter([](SegmentHeader *h) { h->request_depth = 128; }));
    EXPECT_FALSE(validatesAfter([](SegmentHeader *h) { h->completion_depth = 128; }));
    EXPECT_FALSE(validatesAfter([](SegmentHeader *h) { h->notification_depth = 32; }));
}

TEST(Layout, ValidateRejectsLyingGeometry) {
    EXPECT_FALSE(validatesAfter([](SegmentHeader *h) { h->request_offset += 64; }));
    EXPECT_FALSE(validatesAfter([](SegmentHeader *h) { h->request_offset = 0; }));
    EXPECT_FALSE(validatesAfter([](SegmentHeader *h) { h->completion_offset -= 64; }));
    EXPECT_FALSE(validatesAfter([](SegmentHeader *h) { h->notification_offset = 1ull << 40; }));
    EXPECT_FALSE(validatesAfter([](SegmentHeader *h) { h->total_bytes += 4096; }, 4096));
    EXPECT_FALSE(validatesAfter([](SegmentHeader *h) { h->total_bytes -= 4096; }));
    EXPECT_FALSE(validatesAfter([](SegmentHeader *h) { h->total_bytes = ~0ull; }));
}

TEST(Layout, ValidateRejectsMappingTooSmall) {
    const SegmentGeometry g = SegmentGeometry::forDepth(64);
    EXPECT_FALSE(validatesAfter([](SegmentHeader *) {}, static_cast<uint64_t>(-1)));
    EXPECT_FALSE(validatesAfter([](SegmentHeader *) {}, static_cast<uint64_t>(-4096)));
    Buffer buf(g.total_bytes);
    initSegment(buf.data(), g, 7);
    SegmentGeometry out;
    EXPECT_FALSE(validateSegment(buf.data(), 0, &out));
    EXPECT_FALSE(validateSegment(buf.data(), sizeof(SegmentHeader) - 1, &out));
    EXPECT_FALSE(validateSegment(buf.data(), sizeof(SegmentHeader), &out));
    EXPECT_TRUE(validateSegment(buf.data(), g.total_bytes, &out));
}

// A mapping smaller than the header is refused without reading it: the header here straddles a
// PROT_NONE page, so a read of any field past the mapped bytes would fault.
TEST(Layout, ValidateDoesNotReadPastATinyMapping) {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    void *p = ::mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    ASSERT_EQ(::mprotect(static_cast<char *>(p) + page, page, PROT_NONE), 0);
    const void *base = static_cast<char *>(p) + page - 128;
    SegmentGeometry out;
    EXPECT_FALSE(validateSegment(base, 128, &out));
    ::munmap(p, 2 * page);
}

}  // namespace
}  // namespace tensorlane::ipc
