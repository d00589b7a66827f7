#include "transport/tcp/links.hpp"

#include <algorithm>
#include <cerrno>

namespace tensorlane::sidecar {

namespace {

// Rejected writes are still read off the socket (the stream has no other way to skip them);
// their bytes go here.
constexpr size_t kScratchBytes = 256 * 1024;

}  // namespace

// ----- OutLink

OutLink::OutLink(std::vector<Connection *> data, uint32_t chunk_bytes, size_t window)
    : data_(std::move(data)), chunk_bytes_(chunk_bytes), window_(window) {}

Status OutLink::post(WriteOp op, uint64_t remote_region, int64_t now_ms) {
    if (inflight_.size() >= window_) {
        return {Code::kAgain, "too many writes in flight to this peer"};
    }
    const uint64_t seq = next_seq_++;
    const uint8_t *src = op.src->base + op.src_offset;
    ChunkHeader c;
    c.region = remote_region;
    c.write_offset = op.dst_offset;
    c.total_bytes = op.bytes;
    c.imm = op.imm;
    const uint64_t total = op.bytes;
    inflight_.push_back(InFlight{seq, std::move(op)});

    // Chunks rotate over the data connections so a large write streams over all of them; the
    // target puts the notifications back in sequence order, so striping never reorders them.
    uint8_t head[kChunkFrameOverhead];
    for (uint64_t off = 0; off < total;) {
        const uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(chunk_bytes_, total - off));
        c.chunk_offset = off;
        encodeChunkFrame(head, seq, c, len);
        Connection *conn = data_[next_conn_++ % data_.size()];
        conn->queueChunk(head, src + off, len);
        off += len;
    }
    // Send at once from the caller's thread: a small write then costs one writev and no wakeup.
    // A socket error here is also reported by epoll (EPOLLERR), where the session is failed.
    for (Connection *conn : data_) {
        if (conn->hasOutput()) {
            (void)conn->flush(now_ms);
        }
    }
    return Status::ok();
}

bool OutLink::onAck(uint64_t seq, Code code, std::vector<Completion> *out) {
    if (inflight_.empty() || inflight_.front().seq != seq) {
        return false;
    }
    InFlight &f = inflight_.front();
    Completion done;
    done.op_id = f.op.op_id;
    done.code = code;
    done.bytes = f.op.bytes;
    if (code == Code::kNotFound) {
        done.reason =
            "the target refused the write: its region is not exposed, was revoked, "
            "or the write is out of its bounds";
    } else if (code != Code::kOk) {
        done.reason = "the target failed the write";
    }
    out->push_back(std::move(done));
    inflight_.pop_front();
    return true;
}

void OutLink::failAll(Code code, const std::string &reason, std::vector<Completion> *out) {
    for (InFlight &f : inflight_) {
        out->push_back(Completion{f.op.op_id, code, reason, f.op.bytes});
    }
    inflight_.clear();
}

// ----- InLink

InLink::InLink(RegionTable &regions, std::string peer_name, uint32_t max_chunk, size_t window)
    : regions_(regions),
      peer_name_(std::move(peer_name)),
      max_chunk_(max_chunk),
      window_(window),
      scratch_(kScratchBytes) {}

int InLink::beginChunk(Connection &c, std::string *error) {
    FrameHeader h;
    if (!decodeFrameHeader(c.bufferedData(), &h)) {
        *error = "bad frame magic on a data connection";
        return EPROTO;
    }
    if (h.type != FrameType::kChunk) {
        *error = "unexpected " + frameTypeName(static_cast<uint8_t>(h.type)) +
                 " frame on a data connection";
        return EPROTO;
    }
    if (h.length <= kChunkHeaderBytes || h.length - kChunkHeaderBytes > max_chunk_) {
        *error = "chunk frame of " + std::to_string(h.length) + " bytes (limit " +
                 std::to_string(max_chunk_) + " + " + std::to_string(kChunkHeaderBytes) + ")";
        return EPROTO;
    }
    const uint64_t chunk_len = h.length - kChunkHeaderBytes;
    const ChunkHeader ch = decodeChunkHeader(c.bufferedData() + kFrameHeaderBytes);
    c.consume(kChunkFrameOverhead);

    const uint64_t seq = h.arg;
    if (seq < next_deliver_ || seq - next_deliver_ >= window_) {
        *error = "write sequence number " + std::to_string(seq) + " outside the window [" +
                 std::to_string(next_deliver_) + ", +" + std::to_string(window_) + ")";
        return EPROTO;
    }
    auto [it, inserted] = pending_.try_emplace(seq);
    RxWrite &w = it->second;
    if (inserted) {
        if (ch.total_bytes == 0) {
            *error = "write of 0 bytes";
            return EPROTO;
        }
        w.region_id = ch.region;
        w.offset = ch.write_offset;
        w.total = ch.total_bytes;
        w.imm = ch.imm;
        // Checked once per write against the shared table: exposed, not revoked, in bounds.
        // A write that fails is still read off the stream, and answered with kNotFound.
        auto r = regions_.find(ch.region);
        if (r && r->base != nullptr && r->exposed.load(std::memory_order_acquire) &&
            !r->revoked.load(std::memory_order_acquire) && r->contains(w.offset, w.total)) {
            w.region = std::move(r);
        } else {
            w.code = Code::kNotFound;
        }
    } else if (w.region_id != ch.region || w.offset != ch.write_offset ||
               w.total != ch.total_bytes || w.imm != ch.imm) {
        *error = "chunk of write " + std::to_string(seq) + " disagrees with its first chunk";
        return EPROTO;
    }
    if (ch.chunk_offset > w.total || chunk_len > w.total - ch.chunk_offset ||
        chunk_len > w.total - w.received) {
        *error = "chunk at " + std::to_string(ch.chunk_offset) + "+" + std::to_string(chunk_len) +
                 " outside write " + std::to_string(seq) + " of " + std::to_string(w.total) +
                 " bytes";
        return EPROTO;
    }
    c.rx.active = true;
    c.rx.write = &w;
    c.rx.remaining = chunk_len;
    c.rx.length = chunk_len;
    c.rx.dest = w.code == Code::kOk ? w.region->base + w.offset + ch.chunk_offset : nullptr;
    return 0;
}

void InLink::finishChunk(Connection &c) {
    auto *w = static_cast<RxWrite *>(c.rx.write);
    w->received += c.rx.length;
    c.rx = ChunkRx{};
}

int InLink::onReadable(Connection &c, size_t budget, int64_t now_ms, std::string *error) {
    size_t used = 0;
    while (used < budget) {
        if (!c.rx.active) {
            if (c.buffered() < kChunkFrameOverhead) {
                int rc = c.fillAtLeast(kChunkFrameOverhead, now_ms);
                if (rc == EAGAIN) {
                    return 0;
                }
                if (rc != 0) {
                    return rc;
                }
                continue;
            }
            int rc = beginChunk(c, error);
            if (rc != 0) {
                return rc;
            }
            // Headers count too, so a stream of tiny writes also yields after the budget.
            used += kChunkFrameOverhead;
        }
        ChunkRx &rx = c.rx;
        auto *w = static_cast<RxWrite *>(rx.write);
        while (rx.remaining > 0) {
            if (used >= budget) {
                return 0;
            }
            // A region revoked mid-write takes no more bytes (a chunk in the middle of a readv
            // may still finish: the shared_ptr keeps that memory mapped).
            if (rx.dest != nullptr && w->region->revoked.load(std::memory_order_acquire)) {
                rx.dest = nullptr;
                w->code = Code::kNotFound;
            }
            uint8_t *dest = rx.dest != nullptr ? rx.dest : scratch_.data();
            const size_t want = rx.dest != nullptr
                                    ? rx.remaining
                                    : std::min<uint64_t>(rx.remaining, scratch_.size());
            size_t got = 0;
            int rc = c.readInto(dest, want, &got, now_ms);
            if (rc == EAGAIN) {
                return 0;
            }
            if (rc != 0) {
                return rc;
            }
            if (rx.dest != nullptr) {
                rx.dest += got;
            }
            rx.remaining -= got;
            used += got;
            if (got < want && rx.remaining > 0 && c.buffered() == 0) {
                // The socket is drained; epoll reports it again when more bytes come.
                return 0;
            }
        }
        finishChunk(c);
    }
    return 0;
}

bool InLink::deliverable() const {
    if (pending_.empty()) {
        return false;
    }
    const auto &[seq, w] = *pending_.begin();
    return seq == next_deliver_ && w.received == w.total;
}

size_t InLink::deliver(EventSink &sink, Connection &control) {
    size_t n = 0;
    while (deliverable()) {
        auto it = pending_.begin();
        RxWrite &w = it->second;
        Code code = w.code;
        // Deregistered before its last byte landed: the owner is gone, so the writer is told the
        // region was revoked rather than that its data was delivered.
        if (code == Code::kOk && w.region->revoked.load(std::memory_order_acquire)) {
            code = Code::kNotFound;
        }
        if (code == Code::kOk) {
            sink.arrived(w.region_id, w.imm, w.offset, w.total, peer_name_);
            ++writes_received_;
            bytes_received_ += w.total;
        }
        uint8_t payload[8];
        storeLe32(payload, static_cast<uint32_t>(code));
        storeLe32(payload + 4, 0);
        control.queueFrame(FrameType::kAck, it->first, payload);
        pending_.erase(it);
        ++next_deliver_;
        ++n;
    }
    return n;
}

}  // namespace tensorlane::sidecar
