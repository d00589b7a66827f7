// The one loop that reads frames off a Connection: fill once, hand each whole frame to the
// caller, and say how the pass ended (drained, stopped by the caller, a malformed frame, the
// stream closed, the socket failed). The peer layer's handshakes and control connections, tcp's
// ACKs and verbs' channel all read through it, so a partial frame, a frame over its limit and
// an end of stream in the middle of one are handled the same way everywhere.
#pragma once

#include <cerrno>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "net/connection.hpp"

namespace tensorlane::sidecar {

/// What a frame handler tells readFrames().
enum class FrameStep {
    kNext,  ///< handled: the frame is consumed and the next one read
    kStop,  ///< stop now (the handler may have closed or handed over the connection)
};

/// How a readFrames() pass ended.
struct FramesRead {
    enum class End {
        kDrained,  ///< every whole frame buffered was handled; wait for the socket
        kStopped,  ///< a handler returned kStop; the connection may be gone: do not touch it
        kBad,      ///< a malformed frame (or one over the limit): `error` says how
        kClosed,   ///< the other end closed the stream, after every whole frame before it
        kFailed,   ///< the socket failed with `rc` (errnoText(rc) says it in words)
    };
    End end = End::kDrained;
    int rc = 0;
    std::string error;
};

/// Reads what the socket has (one fill()) and hands every whole frame to
/// `on_frame(const FrameHeader &, std::span<const uint8_t> payload) -> FrameStep`, in order. A
/// handler may consume the frame itself (consumeFrame() is idempotent) and may send on `c`.
/// `max_payload` is a number, or a callable giving the limit for the next frame (a handshake's
/// limit until it is done, the control limit after).
template <class Limit, class Handler>
FramesRead readFrames(Connection &c, int64_t now_ms, Limit max_payload, Handler &&on_frame) {
    const int rc = c.fill(now_ms);
    for (;;) {
        uint32_t limit = 0;
        if constexpr (std::is_invocable_v<Limit>) {
            limit = max_payload();
        } else {
            limit = static_cast<uint32_t>(max_payload);
        }
        FrameHeader h;
        std::span<const uint8_t> payload;
        std::string error;
        const Connection::Parse parsed = c.nextFrame(limit, &h, &payload, &error);
        if (parsed == Connection::Parse::kNeedMore) {
            break;
        }
        if (parsed == Connection::Parse::kBad) {
            return {FramesRead::End::kBad, 0, std::move(error)};
        }
        if (on_frame(h, payload) == FrameStep::kStop) {
            return {FramesRead::End::kStopped, 0, {}};
        }
        c.consumeFrame(h);
    }
    if (rc == ECONNRESET) {
        return {FramesRead::End::kClosed, rc, {}};
    }
    if (rc != 0 && rc != EAGAIN) {
        return {FramesRead::End::kFailed, rc, {}};
    }
    return {FramesRead::End::kDrained, rc, {}};
}

}  // namespace tensorlane::sidecar
