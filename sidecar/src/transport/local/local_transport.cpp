#include "transport/local/local_transport.hpp"

#include <cstring>

#include "tensorlane/ipc/doorbell.hpp"

namespace tensorlane::sidecar {

LocalTransport::LocalTransport(RegionTable &regions, std::string node_name)
    : regions_(regions), node_name_(std::move(node_name)) {
    (void)ipc::makeEventFd(&wake_);
    worker_ = std::thread([this] { copyLoop(); });
}

LocalTransport::~LocalTransport() {
    {
        std::lock_guard lock(mu_);
        stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
}

LocalTransport::Done LocalTransport::execute(const WriteOp &op) {
    Done d{op.op_id, Code::kOk, op.dst_region, op.imm, op.dst_offset, op.bytes, {}};
    // Look the target up at copy time: a region revoked after the post is not written.
    auto dst = regions_.find(op.dst_region);
    if (!dst || dst->revoked.load(std::memory_order_acquire) ||
        !dst->exposed.load(std::memory_order_acquire)) {
        d.status = Code::kNotFound;
        d.reason = "target region " + std::to_string(op.dst_region) + " is gone";
        return d;
    }
    if (!dst->contains(op.dst_offset, op.bytes) || !op.src->contains(op.src_offset, op.bytes)) {
        d.status = Code::kInvalid;
        d.reason = "write out of bounds";
        return d;
    }
    std::memcpy(dst->base + op.dst_offset, op.src->base + op.src_offset, op.bytes);
    return d;
}

Status LocalTransport::post(WriteOp op) {
    std::unique_lock lock(mu_);
    ++in_flight_;
    // Inline only when nothing is queued ahead, so notifications keep submission order.
    if (op.bytes <= kInlineBytes && queue_.empty() && !copying_) {
        lock.unlock();
        Done d = execute(op);
        lock.lock();
        done_.push_back(std::move(d));
        return Status::ok();
    }
    queue_.push_back(std::move(op));
    lock.unlock();
    cv_.notify_one();
    return Status::ok();
}

void LocalTransport::copyLoop() {
    std::unique_lock lock(mu_);
    for (;;) {
        cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (stopping_) {
            return;
        }
        WriteOp op = std::move(queue_.front());
        queue_.pop_front();
        copying_ = true;
        lock.unlock();
        Done d = execute(op);
        op.src.reset();
        lock.lock();
        copying_ = false;
        done_.push_back(std::move(d));
        ipc::ring(wake_.get());
    }
}

size_t LocalTransport::progress(EventSink &sink) {
    {
        std::lock_guard lock(mu_);
        if (done_.empty()) {
            return 0;
        }
        reporting_.swap(done_);
        in_flight_ -= reporting_.size();
    }
    ipc::drain(wake_.get());
    for (const Done &d : reporting_) {
        // The copy is complete and visible (same address space, program order): notify the
        // owner first, then complete the writer, as DESIGN.md's data path requires.
        if (d.status == Code::kOk) {
            sink.arrived(d.dst, d.imm, d.offset, d.bytes, node_name_);
        }
        sink.completed(d.op_id, d.status, d.reason);
    }
    size_t n = reporting_.size();
    reporting_.clear();
    return n;
}

size_t LocalTransport::inFlight() const {
    std::lock_guard lock(mu_);
    return in_flight_;
}

}  // namespace tensorlane::sidecar
