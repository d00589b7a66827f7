// The GDR flush: before the owner of a GPU region is told that a peer's write is in it, an RDMA
// READ of a few bytes of that region on a loopback queue pair. The NIC's writes into GPU memory
// are posted PCIe writes that a consumer on the GPU can overtake on some platforms; the READ's
// response cannot pass them, so once it completes every byte written before it is visible
// (NCCL's net_ib does the same). One READ covers every write placed before it.
//
// The loopback pair lives in the receiving session's protection domain (the READ needs the
// region's MR, which this domain holds) and is connected only to itself: the requester QP has
// no remote access, the responder QP allows remote READ, and no peer can reach either. MRs of
// regions that may need a flush therefore carry IBV_ACCESS_REMOTE_READ; the peer's QPs allow
// remote writes only, and an RDMA operation needs both the QP's and the MR's permission, so the
// peer still cannot read them (docs/verbs.md, "GDR flush").
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tensorlane/sidecar/status.hpp"
#include "transport/verbs/objects.hpp"
#include "transport/verbs/qp.hpp"

namespace tensorlane::sidecar {

class GdrFlusher {
public:
    /// Makes the loopback pair on `pd` (completions on `cq`) and connects it to itself through
    /// `gid` with `params`.
    Status create(ibv_pd *pd, ibv_cq *cq, const QpParams &params,
                  const std::array<uint8_t, 16> &gid);
    bool ready() const { return requester_ != nullptr; }
    /// Posts the READ of `bytes` (1..8) at (addr, rkey); its completion carries `wr_id`.
    bool post(uint64_t addr, uint32_t rkey, uint32_t bytes, uint64_t wr_id);
    /// Whether a work completion is this flusher's.
    bool owns(const ibv_wc &wc) const;
    uint64_t posted() const { return posted_; }

private:
    verbs_detail::QpPtr requester_;
    verbs_detail::QpPtr responder_;
    std::vector<uint8_t> sink_;
    verbs_detail::MrPtr sink_mr_;
    uint64_t posted_ = 0;
};

}  // namespace tensorlane::sidecar
