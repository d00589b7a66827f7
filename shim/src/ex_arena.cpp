#include "ex_arena.hpp"

#include <algorithm>

#include "last_error.hpp"

namespace tensorlane::shim {

namespace {
constexpr size_t kAlign = 64;
}  // namespace

tl_status ExArena::take(size_t bytes, Block *out) {
    const size_t want = (bytes + kAlign - 1) & ~(kAlign - 1);
    {
        std::lock_guard lock(mu_);
        for (uint32_t i = 0; i < buffers_.size(); ++i) {
            Buffer &b = buffers_[i];
            if (b.live == 0) {
                b.used = 0;
            }
            if (b.bytes - b.used >= want) {
                *out = Block{b.region, b.used, b.base + b.used, i};
                b.used += want;
                ++b.live;
                return TL_OK;
            }
        }
        if (held_ + std::max(want, kBufferBytes) > kMaxBytes) {
            return fail(Code::kAgain,
                        "the descriptions of the grouped writes and payloads in flight fill " +
                            std::to_string(kMaxBytes >> 20) + " MiB: wait on a ticket and retry");
        }
    }
    // A new buffer, allocated outside the lock (a socket call).
    const size_t size = std::max(want, kBufferBytes);
    void *ptr = nullptr;
    tl_region region = 0;
    if (tl_status st = alloc_(size, &ptr, &region); st != TL_OK) {
        return st;
    }
    std::lock_guard lock(mu_);
    buffers_.push_back(Buffer{region, static_cast<unsigned char *>(ptr), size, want, 1});
    held_ += size;
    *out = Block{region, 0, static_cast<unsigned char *>(ptr),
                 static_cast<uint32_t>(buffers_.size() - 1)};
    return TL_OK;
}

void ExArena::give(const Block &b) {
    std::lock_guard lock(mu_);
    if (b.buffer < buffers_.size() && buffers_[b.buffer].live != 0) {
        --buffers_[b.buffer].live;
    }
}

size_t ExArena::heldBytes() const {
    std::lock_guard lock(mu_);
    return held_;
}

}  // namespace tensorlane::shim
