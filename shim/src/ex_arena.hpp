// Where the shim keeps the descriptions of its kWriteEx requests (tl_write_msg, tl_write_group;
// ipc/layout.hpp, ExHeader): host buffers of its own, allocated from the sidecar like
// tl_alloc_host's (so the sidecar can read them, and write each entry's status back), carved
// into blocks that live from submission until the ticket ends.
//
// A block is taken from the first buffer with room at its end; a buffer whose blocks have all
// been given back starts again from its beginning. Tickets end roughly in the order they were
// issued, so this keeps few buffers for any load. Thread-safe; give() may run with the rings'
// lock held (it never calls out).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "tensorlane/tensorlane.h"

namespace tensorlane::shim {

class ExArena {
public:
    /// Allocates a host buffer shared with the sidecar (Client::allocHost).
    using AllocFn = std::function<tl_status(size_t bytes, void **ptr, tl_region *out)>;
    /// Buffers are this large, or as large as one description needs.
    static constexpr size_t kBufferBytes = size_t{1} << 20;
    /// The most the arena holds in all: past it a request waits for earlier tickets to end
    /// (TL_EAGAIN).
    static constexpr size_t kMaxBytes = size_t{64} << 20;

    explicit ExArena(AllocFn alloc) : alloc_(std::move(alloc)) {}

    struct Block {
        tl_region region = 0;  ///< the buffer's region
        uint64_t offset = 0;   ///< the block's offset in it
        unsigned char *ptr = nullptr;
        uint32_t buffer = 0;  ///< index in buffers_
    };
    /// A block of `bytes` (64-byte aligned). TL_EAGAIN past kMaxBytes; else allocHost's error.
    tl_status take(size_t bytes, Block *out);
    /// Gives a block back.
    void give(const Block &b);
    /// Bytes of buffers held (tests).
    size_t heldBytes() const;

private:
    struct Buffer {
        tl_region region = 0;
        unsigned char *base = nullptr;
        size_t bytes = 0;
        size_t used = 0;
        uint32_t live = 0;  ///< blocks not given back
    };
    AllocFn alloc_;
    mutable std::mutex mu_;
    std::vector<Buffer> buffers_;
    size_t held_ = 0;
};

}  // namespace tensorlane::shim
