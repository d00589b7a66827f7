// The stream-ordered calls' control messages and the engine's watch over the stream segments
// (docs/gpu.md, "Stream-ordered writes").
#include "engine_impl.hpp"

namespace tensorlane::sidecar {

void EngineImpl::onStreamSetup(Session &s, const ipc::MsgHeader &h) {
    if (s.streams) {
        reply(s, h.seq, Code::kInvalid, 0, 0, "the stream segment exists already");
        return;
    }
    if (mappings_ >= max_mappings_) {
        reply(s, h.seq, Code::kNoMemory, 0, 0,
              "the sidecar has no room for another segment (vm.max_map_count)");
        return;
    }
    ipc::UniqueFd fd;
    std::string error;
    auto streams = SessionStreams::create(cfg_.ipc.ring_depth, s.cred.uid, s.cred.gid, &fd, &error);
    if (!streams) {
        log_->warn("session {}: no stream segment: {}", s.id, error);
        reply(s, h.seq, Code::kNoMemory, 0, 0, "stream segment: " + error);
        return;
    }
    const uint32_t slots = streams->ticketSlots();
    s.streams = std::move(streams);
    ++mappings_;
    stream_sessions_.push_back(s.id);
    reply(s, h.seq, Code::kOk, slots, ipc::kStreamSubscriptions, "", fd.get());
}

void EngineImpl::onStreamSubscribe(Session &s, const ipc::StreamSubscribeMsg &m) {
    auto r = regions_.find(m.region);
    if (!r || r->owner != s.id) {
        reply(s, m.h.seq, Code::kNotFound, 0, 0,
              "tl_stream_wait_notification: no region " + std::to_string(m.region) +
                  " of this client");
        return;
    }
    if (!s.streams) {
        reply(s, m.h.seq, Code::kInvalid, 0, 0, "no stream segment (kStreamSetup first)");
        return;
    }
    uint32_t slot = 0;
    if (Status st = s.streams->subscribe(m.region, m.imm, &slot); !st.isOk()) {
        reply(s, m.h.seq, st.code(), 0, 0, "tl_stream_wait_notification: " + st.message());
        return;
    }
    // From now on notifications for the pair are counted here. Those still in our backlog
    // move to the count; those already in the ring are published before we answer, so the
    // client finds every earlier one when it drains the ring after our reply (and credits
    // them back with kStreamCredit).
    uint32_t backlog = 0;
    for (auto it = s.notification_backlog.begin(); it != s.notification_backlog.end();) {
        if (it->region == m.region && it->imm == m.imm) {
            it = s.notification_backlog.erase(it);
            ++backlog;
        } else {
            ++it;
        }
    }
    s.streams->credit(slot, backlog);
    s.publish();
    reply(s, m.h.seq, Code::kOk, slot, 0, "");
}

void EngineImpl::onStreamCredit(Session &s, const ipc::StreamCreditMsg &m) {
    if (!s.streams) {
        reply(s, m.h.seq, Code::kInvalid, 0, 0, "no stream segment");
        return;
    }
    s.streams->credit(m.slot, m.count);
    reply(s, m.h.seq, Code::kOk, 0, 0, "");
}

size_t EngineImpl::pollStreams() {
    if (stream_sessions_.empty()) {
        return 0;
    }
    size_t work = 0;
    for (size_t i = 0; i < stream_sessions_.size();) {
        Session *s = findSession(stream_sessions_[i]);
        if (s == nullptr) {
            stream_sessions_.erase(stream_sessions_.begin() + static_cast<ptrdiff_t>(i));
            continue;
        }
        ++i;
        if (s->closing || !s->streams) {
            continue;
        }
        if (s->streams->held() != 0) {
            for (WriteOp &op : s->streams->opened()) {
                // Its stream has reached it: from here it is an ordinary accepted write.
                PeerQueue &q = queues_[op.peer];
                ++work;
                if (q.ops.empty() && postNow(op)) {
                    continue;
                }
                q.ops.push_back(std::move(op));
                ++queued_;
            }
        }
        work += s->streams->pollNotify();
    }
    if (work != 0) {
        streams_moved_ = std::chrono::steady_clock::now();
    }
    return work;
}

bool EngineImpl::streamsUrgent() const {
    for (SessionId id : stream_sessions_) {
        auto it = sessions_.find(id);
        if (it != sessions_.end() && it->second->streams && it->second->streams->urgent()) {
            return true;
        }
    }
    return false;
}

}  // namespace tensorlane::sidecar
