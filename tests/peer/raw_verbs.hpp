// The RDMA half of a raw verbs peer: its own device context, protection domain, CQ and RC QPs on
// the simulated HCA, brought up with the project's QP helpers, so that a test can post what a
// real sender never would (a forged descriptor, a write outside the key it was given) after a
// bootstrap that passes every check.
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "transport/verbs/objects.hpp"
#include "transport/verbs/qp.hpp"
#include "transport/verbs/wire.hpp"

namespace tensorlane::peertest {

class RawVerbsEnd {
public:
    /// Opens simulated device `sim<index>` (of simTree()) and makes `qps` QPs in INIT.
    bool open(int index, uint32_t qps, std::string *why);
    ~RawVerbsEnd();
    /// The SELECT payload: our GID, MTU, traffic class and QPs.
    sidecar::VerbsBlob blob() const;
    /// RTR/RTS against the receiver's QPs (its SELECTED payload).
    bool connect(const sidecar::VerbsBlob &receiver, std::string *why);
    /// RDMA WRITE of `d` into the receiver's ring slot for d.seq, on QP `qp`.
    bool postDescriptor(uint32_t qp, const sidecar::WriteDescriptor &d);
    /// A message as a sender posts one: `d` (the whole slot, whatever its message_bytes say)
    /// into the ring slot for d.seq with a WRITE_WITH_IMM carrying `wire_imm`.
    bool postMessage(uint32_t qp, const sidecar::WriteDescriptor &d, uint32_t wire_imm);
    /// WRITE_WITH_IMM of `len` bytes of our buffer to (addr, rkey) with the wire immediate.
    bool postData(uint32_t qp, uint64_t addr, uint32_t rkey, uint32_t len, uint32_t wire_imm);
    /// RDMA READ of `len` bytes at (addr, rkey) into our buffer.
    bool postRead(uint32_t qp, uint64_t addr, uint32_t rkey, uint32_t len);
    /// Waits for the next send completion; its status, or -1 on timeout.
    int nextCompletion(int timeout_ms);

private:
    /// One signalled work request from our buffer at `local_offset`.
    bool post(uint32_t qp, ibv_wr_opcode opcode, uint64_t local_offset, uint32_t len,
              uint64_t remote_addr, uint32_t rkey, uint32_t wire_imm);

    sidecar::verbs_detail::ContextPtr ctx_;
    sidecar::verbs_detail::PdPtr pd_;
    sidecar::verbs_detail::CqPtr cq_;
    std::vector<sidecar::verbs_detail::QpPtr> qps_;
    std::vector<sidecar::QpEndpoint> local_;
    sidecar::QpParams params_;
    std::array<uint8_t, 16> gid_{};
    sidecar::VerbsBlob remote_;
    std::vector<uint8_t> buf_;
    sidecar::verbs_detail::MrPtr mr_;
};

}  // namespace tensorlane::peertest
