#include "transport/local/local_job.hpp"

#include <utility>

namespace tensorlane::sidecar {

Code checkStart(const WriteOp &op, const char **why) {
    // Checked when the copy starts: a target deregistered or unexposed after the post is not
    // written. The shared_ptrs keep both ranges (and CUDA imports) alive for as long as we copy.
    if (op.dst->revoked.load(std::memory_order_acquire) ||
        !op.dst->exposed.load(std::memory_order_acquire)) {
        *why = "target region is gone";
        return Code::kNotFound;
    }
    if (op.bytes == 0) {
        // A message (WriteOp::message): no bytes to copy, so no memory is touched at either
        // end; the target must still be there and the offset inside it.
        if (op.dst_offset > op.dst->bytes) {
            *why = "message offset past the end of the region";
            return Code::kInvalid;
        }
        return Code::kOk;
    }
    if (op.extents) {
        // Host regions at both ends (post() checked the kinds); every range inside both.
        if (op.src->base == nullptr || op.dst->base == nullptr) {
            *why = "write out of bounds";
            return Code::kInvalid;
        }
        for (const Extent &e : *op.extents) {
            if (!op.dst->contains(e.dst_offset, e.bytes) ||
                !op.src->contains(e.src_offset, e.bytes)) {
                *why = "write out of bounds";
                return Code::kInvalid;
            }
        }
        return Code::kOk;
    }
    if (op.dst->dmabufOnly() || op.src->dmabufOnly()) {
        *why = kDmabufOnlyReason;
        return Code::kCuda;
    }
    const auto usable = [](const Region &r) {
        return r.kind == MemoryKind::kCuda ? r.cuda.import != nullptr : r.base != nullptr;
    };
    if (!usable(*op.dst) || !usable(*op.src) || !op.dst->contains(op.dst_offset, op.bytes) ||
        !op.src->contains(op.src_offset, op.bytes)) {
        *why = "write out of bounds";
        return Code::kInvalid;
    }
    return Code::kOk;
}

LocalDone landed(const WriteOp &op, SessionId sid) {
    if (op.dst->revoked.load(std::memory_order_acquire)) {
        return failed(op, sid, Code::kNotFound, "target region was deregistered during the write");
    }
    return LocalDone{op.op_id,      Code::kOk, "",  op.dst_region, op.imm,
                     op.dst_offset, op.bytes,  sid, op.silent,     op.message};
}

LocalDone failed(const WriteOp &op, SessionId sid, Code code, std::string why) {
    return LocalDone{op.op_id, code, std::move(why), 0, 0, 0, 0, sid};
}

}  // namespace tensorlane::sidecar
