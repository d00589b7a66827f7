// `tensorlane bench`: the responder worker (on node-b's sidecar: it echoes the writes that ask
// for it and drains the rest) and what it shares with the bench: the immediates' meaning, the
// timestamp page, the setup messages, and small shim helpers.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "tensorlane/tensorlane.h"

namespace tensorlane::tools::bench {

// The immediate: bit 31 asks the responder to write the bytes back; the rest is a sequence
// number, so a stray notification is noticed.
constexpr uint32_t kEchoBit = 0x80000000u;
constexpr uint32_t kSeqMask = 0x7fffffffu;
/// The last write of a bench against a responder started on its own (--respond): it exits.
/// Sequence numbers skip it.
constexpr uint32_t kByeImm = 0x7fffffffu;
/// Where the responder leaves, per echoed write, when it saw the notification and when its
/// echo was posted (steady clock, which is CLOCK_MONOTONIC: one clock for both processes), so
/// the round trip splits into A->B, B's turnaround and B->A. A shared anonymous mapping made
/// before the fork; indexed by sequence number.
struct EchoStamp {
    std::atomic<uint32_t> imm;  ///< written last (release): the slot is whole once it matches
    uint32_t pad;
    int64_t noted_ns;
    int64_t posted_ns;
};
constexpr uint32_t kStampSlots = 4096;  // a power of two
static_assert(std::atomic<uint32_t>::is_always_lock_free);

/// Now on the steady clock (CLOCK_MONOTONIC), in nanoseconds.
int64_t nowNs();

/// What the bench tells a forked responder (over its socketpair) or a --respond one (from its
/// command line): the regions to use and how big they are.
struct SetupMsg {
    char a_node[64];
    char a_region[64];
    char b_region[64];
    uint64_t max_bytes;
};

/// The responder's answer to the bench: ready, or why it failed.
struct ReplyMsg {
    int32_t status;  ///< 0: ready; else failed (text in error)
    char error[512];
};

struct ClientCloser {
    void operator()(tl_client *c) const { tl_disconnect(c); }
};
/// A shim connection, disconnected at destruction.
using ClientPtr = std::unique_ptr<tl_client, ClientCloser>;

/// Copies `src` into a fixed NUL-terminated field of `cap` bytes (cut when longer).
void copyName(char *dst, size_t cap, const std::string &src);
/// "`what`: " and the shim's last error.
std::string callError(const std::string &what);
/// tl_lookup, retried while the name is not there yet (the other side exposes it).
tl_status lookupRetry(tl_client *c, const std::string &peer, const std::string &name,
                      tl_remote *out, std::chrono::seconds timeout);

/// The worker on node-b: exposes a region, echoes writes that ask for it, drains the rest.
/// Forked (ctl >= 0): the setup comes over ctl, and it ends when the bench closes ctl. On its
/// own (ctl < 0, `given` set): it ends at kByeImm or a signal. `stamps` may be null. Returns
/// the process's exit status.
int responderMain(int ctl, const std::string &socket, EchoStamp *stamps,
                  const SetupMsg *given = nullptr);

}  // namespace tensorlane::tools::bench
