#include "transport/local/local_transport.hpp"

#include <algorithm>
#include <cstring>

namespace tensorlane::sidecar {

LocalTransport::LocalTransport(RegionTable &regions, std::string node_name)
    : regions_(regions), node_name_(std::move(node_name)) {}

Status LocalTransport::post(WriteOp op) {
    queue_.push_back(Pending{std::move(op), nullptr, 0});
    return Status::ok();
}

size_t LocalTransport::progress(EventSink &sink) {
    size_t events = 0;
    uint64_t budget = kSliceBytes;
    while (!queue_.empty() && budget > 0) {
        Pending &p = queue_.front();
        const WriteOp &op = p.op;
        if (p.copied == 0) {
            // Resolve the target when the copy starts: a region revoked after the post is not
            // written, and a region cannot go away under a copy that holds it.
            p.dst = regions_.find(op.dst_region);
            Code code = Code::kOk;
            const char *why = "";
            if (!p.dst || p.dst->revoked.load(std::memory_order_acquire) ||
                !p.dst->exposed.load(std::memory_order_acquire)) {
                code = Code::kNotFound;
                why = "target region is gone";
            } else if (!p.dst->contains(op.dst_offset, op.bytes) ||
                       !op.src->contains(op.src_offset, op.bytes)) {
                code = Code::kInvalid;
                why = "write out of bounds";
            }
            if (code != Code::kOk) {
                uint64_t id = op.op_id;
                queue_.pop_front();
                sink.completed(id, code, why);
                ++events;
                continue;
            }
        }
        uint64_t n = std::min(op.bytes - p.copied, budget);
        std::memcpy(p.dst->base + op.dst_offset + p.copied,
                    op.src->base + op.src_offset + p.copied, n);
        p.copied += n;
        budget -= n;
        if (p.copied == op.bytes) {
            // Same address space, program order: the bytes are visible. Notify the owner
            // first, then complete the writer, as DESIGN.md's data path requires.
            RegionId dst = op.dst_region;
            uint64_t id = op.op_id, offset = op.dst_offset, bytes = op.bytes;
            uint32_t imm = op.imm;
            queue_.pop_front();
            sink.arrived(dst, imm, offset, bytes, node_name_);
            sink.completed(id, Code::kOk, {});
            events += 2;
        }
    }
    return events;
}

}  // namespace tensorlane::sidecar
