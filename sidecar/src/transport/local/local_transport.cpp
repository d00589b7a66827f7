#include "transport/local/local_transport.hpp"

#include <utility>

namespace tensorlane::sidecar {

LocalTransport::LocalTransport(std::string node_name, size_t max_queued)
    : node_name_(std::move(node_name)), max_queued_(max_queued) {}

LocalTransport::~LocalTransport() = default;

Status LocalTransport::post(const WriteOp &op) {
    if (!op.dst || !op.src) {
        return {Code::kInvalid, "local write without a resolved source and target"};
    }
    if (Status st = checkMessage(op); !st.isOk()) {
        return st;
    }
    if (op.bytes != 0 && (op.src->dmabufOnly() || op.dst->dmabufOnly())) {
        return {Code::kCuda, std::string("local: ") + kDmabufOnlyReason};
    }
    if (op.extents && (op.src->kind != MemoryKind::kHost || op.dst->kind != MemoryKind::kHost)) {
        return {Code::kInvalid, "a scattered write is between host regions"};
    }
    if (in_flight_ >= max_queued_) {
        return {Code::kAgain, "the local copy queue is full"};
    }
    LocalJob job;
    job.op = op;
    // A message moves no bytes: the engine thread delivers it, in its session's order.
    job.gpu =
        op.bytes != 0 && (op.src->kind == MemoryKind::kCuda || op.dst->kind == MemoryKind::kCuda);
    ++in_flight_;
    route(op.src->owner, std::move(job));
    return Status::ok();
}

void LocalTransport::route(SessionId sid, LocalJob job) {
    if (auto held = held_.find(sid); held != held_.end()) {
        held->second.push_back(std::move(job));  // behind the ones held before it
        return;
    }
    if (!handed_.contains(sid)) {
        // Nothing of this session's is on the copy thread.
        const bool gpu_busy = gpu_.busy(sid);
        if (!gpu_busy && InlineHostCopies::fits(job)) {
            inline_.copy(std::move(job), sid);
            return;
        }
        if (EngineGpuCopies::fits(job) && !gpu_.full(sid)) {
            gpu_.start(std::move(job), sid);
            return;
        }
        if (gpu_busy) {
            held_[sid].push_back(std::move(job));  // sent on once they have finished
            return;
        }
    }
    ++handed_[sid];
    copy_thread_.hand(std::move(job), sid);
}

void LocalTransport::release(const std::vector<SessionId> &drained) {
    for (SessionId sid : drained) {
        auto held = held_.find(sid);
        if (held == held_.end()) {
            continue;
        }
        std::deque<LocalJob> q = std::move(held->second);
        held_.erase(held);
        for (LocalJob &j : q) {
            route(sid, std::move(j));
        }
    }
}

bool LocalTransport::arm() {
    if (inline_.pending() || !gpu_.idle()) {
        return false;  // copied in post(), or GPU copies of ours to poll: progress() reports them
    }
    return copy_thread_.arm();
}

size_t LocalTransport::progress(EventSink &sink) {
    // Ours first: a session's writes that ended on the engine thread were posted before
    // anything of it that went to the copy thread since. Of ours, the ones copied in post()
    // came before any GPU copy of their session still queued on the engine thread; those sent
    // on after our GPU copies finished come after them.
    std::vector<LocalDone> done = std::exchange(scratch_, {});
    inline_.take(&done);
    if (!gpu_.idle()) {
        drained_.clear();
        gpu_.poll(&done, &drained_);
        release(drained_);
        inline_.take(&done);
    }
    const size_t own_count = done.size();
    copy_thread_.take(&done);
    const size_t n = done.size();
    for (size_t i = 0; i < n; ++i) {
        const LocalDone &d = done[i];
        --in_flight_;
        if (i >= own_count) {
            if (auto h = handed_.find(d.session); h != handed_.end() && --h->second == 0) {
                handed_.erase(h);
            }
        }
        if (d.code == Code::kOk) {
            // The bytes are in place and visible (a fenced memcpy, or a finished CUDA copy). The
            // owner first, then the writer, as DESIGN.md's data path requires.
            if (!d.message.empty()) {
                sink.messageArrived(d.dst, d.imm, d.offset, d.message, node_name_);
            } else if (!d.silent) {
                sink.arrived(d.dst, d.imm, d.offset, d.bytes, node_name_);
            }
        }
        sink.completed(d.op_id, d.code, d.why);
    }
    done.clear();
    scratch_ = std::move(done);  // its capacity, for the next turn
    return n * 2;
}

}  // namespace tensorlane::sidecar
