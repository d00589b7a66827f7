#include "transport/tcp/links.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "net/env_knob.hpp"
#include "net/packed_chunk.hpp"

namespace tensorlane::sidecar {

namespace {

// Rejected writes are still read off the socket (the stream has no other way to skip them);
// their bytes go here.
constexpr size_t kScratchBytes = 256 * 1024;
// Rounds of cut-then-flush per pump: enough to refill connections that drained at once
// (loopback), bounded so one peer cannot hold the engine thread.
constexpr int kPumpRounds = 4;

}  // namespace

// ----- OutLink

OutLink::OutLink(std::vector<Connection *> data, uint32_t chunk_bytes, size_t window,
                 TcpStaging &staging)
    : data_(std::move(data)),
      chunk_bytes_(chunk_bytes),
      window_(window),
      staging_(staging),
      conn_slots_(data_.size()) {}

OutLink::~OutLink() {
    // Copies still running give their slots back when they end; the rest are ours to return.
    staging_.forget(this);
    for (Staged &c : staged_) {
        if (c.ready) {
            staging_.give(c.slot);
        }
    }
    for (auto &q : conn_slots_) {
        for (const Queued &x : q) {
            staging_.give(x.slot);
        }
    }
}

Status OutLink::post(const WriteOp &op, int64_t now_ms, bool send_now) {
    if (inflight_.size() >= window_) {
        return {Code::kAgain, "too many writes in flight to this peer"};
    }
    if (op.bytes != 0 && op.src->kind == MemoryKind::kCuda) {
        // A sidecar that cannot stage (no CUDA here) ends the write at once, never leaves it
        // waiting for a slot that cannot come.
        if (Status st = staging_.ensureStarted(); !st.isOk()) {
            return st;
        }
        if (staging_.slotBytes() < chunk_bytes_) {
            return {Code::kInternal, "GPU staging slots are smaller than a chunk"};
        }
    }
    inflight_.push_back(InFlight{next_seq_++, op, 0, 0});
    data_inflight_ += op.message.empty() ? 1 : 0;
    if (tracing()) {
        traceStep(
            "out %s seq %llu post bytes %llu%s", peer_name_.c_str(),
            static_cast<unsigned long long>(inflight_.back().seq),
            static_cast<unsigned long long>(op.message.empty() ? op.bytes : op.message.size()),
            op.message.empty() ? "" : " message");
    }
    // Send at once from the caller's thread: a small write then costs one sendmsg and no
    // wake-up. A socket error here is also reported by epoll (EPOLLERR), where the session is
    // failed. An op with more to follow waits for them (WriteOp::more): one sendmsg for all.
    if (send_now) {
        (void)pump(now_ms);
    }
    return Status::ok();
}

OutLink::InFlight *OutLink::find(uint64_t seq) {
    if (inflight_.empty() || seq < inflight_.front().seq) {
        return nullptr;
    }
    const uint64_t i = seq - inflight_.front().seq;
    return i < inflight_.size() ? &inflight_[i] : nullptr;
}

Connection *OutLink::roomyConnection(uint64_t watermark, bool small) {
    if (small && last_conn_ < data_.size()) {
        Connection *c = data_[last_conn_];
        if (c->isOpen() && c->queuedBytes() < std::min(watermark, kSmallChunk)) {
            return c;
        }
    }
    for (size_t k = 0; k < data_.size(); ++k) {
        const size_t i = (next_conn_ + k) % data_.size();
        Connection *c = data_[i];
        if (c->isOpen() && c->queuedBytes() < watermark) {
            next_conn_ = (i + 1) % data_.size();
            last_conn_ = i;
            return c;
        }
    }
    return nullptr;
}

size_t OutLink::indexOf(const Connection &c) const {
    for (size_t i = 0; i < data_.size(); ++i) {
        if (data_[i] == &c) {
            return i;
        }
    }
    return data_.size();
}

uint64_t cutLength(uint64_t write_bytes, size_t connections, uint32_t chunk_bytes, bool busy) {
    // A write of a few chunks' size goes as at least two chunks per connection (of 32 KiB and
    // more, page-rounded): its tags, socket copies, checks and landing copies overlap instead
    // of running one after the other, which is what one mid-sized write waits for (an NCCL
    // step is 512 KiB). Writes of 2 x connections x chunk_bytes and more are cut as before.
    // (From 64 KiB until 2026-12-07: a 64 KiB write went whole and took 209-224 us a round
    // trip on the GPU machine, 109-112 us cut in two; 128 KiB 173-178 against 135-143 us.)
    // But only a write alone on the link: behind or beside others, its stages overlap theirs
    // anyway, and each more chunk costs both engines and the tag workers a hand-off (and chunks
    // under 64 KiB are copied to and from the sockets on the engine thread). NCCL's
    // 2-rank ring (four 128 KiB messages each way in flight) took 1.6x as long cut in 32 KiB
    // chunks as sent whole (nccl_plugin_bench --allreduce, GPU machine, 2026-12-07: 1065-1117
    // against 671-697 us at 1 MiB, 3947-4014 against 2349-2395 us at 4 MiB).
    // Not beyond 256 KiB for that, though: two sidecars' 1 MiB writes, 32 in flight, took a
    // third longer in whole chunks than in 256 KiB ones on the vm (presumably the cache: a
    // chunk is read whole before it is checked and copied).
    constexpr uint64_t kMinSplit = 32 << 10;
    constexpr uint64_t kBusyCut = 256 << 10;
    const uint64_t parts = 2 * std::max<uint64_t>(1, connections);
    const uint64_t even = ((write_bytes + parts - 1) / parts + 4095) & ~uint64_t{4095};
    const uint64_t alone = std::min<uint64_t>(chunk_bytes, std::max(kMinSplit, even));
    return busy ? std::max(alone, std::min<uint64_t>(chunk_bytes, kBusyCut)) : alone;
}

uint64_t OutLink::cutBytes(const InFlight &w) const {
    // TENSORLANE_TCP_CUT_ALWAYS (an experiment's knob, docs/peers.md): every write cut as if
    // alone, the policy before 2026-12-07, for A/B runs of one build.
    static const bool always = std::getenv("TENSORLANE_TCP_CUT_ALWAYS") != nullptr;
    // Beside another write with data: a message (one small chunk, an NCCL CTS say) does not
    // overlap a write's stages, so a write beside messages alone is cut as if alone.
    const bool busy = !always && data_inflight_ > (w.op.message.empty() ? 1u : 0u);
    // TENSORLANE_TCP_BUSY_CUT=BYTES (an experiment's knob, docs/peers.md): writes beside others
    // in chunks of this size instead (4 KiB-aligned, at least 4 KiB).
    static const uint64_t busy_cut = [] {
        const uint64_t n = envNumber("TENSORLANE_TCP_BUSY_CUT").value_or(0);
        return n >= 4096 ? n & ~uint64_t{4095} : 0;
    }();
    if (busy && busy_cut != 0) {
        return std::min<uint64_t>(chunk_bytes_, busy_cut);
    }
    return cutLength(w.op.bytes, data_.size(), chunk_bytes_, busy);
}

void OutLink::nextPieces(InFlight &w, uint64_t room, std::vector<Piece> *out) {
    // Extents from this size on go alone, one chunk (or several) each: packing them would save
    // nothing per byte.
    const uint64_t alone = std::min<uint64_t>(256 << 10, room / 4);
    const std::vector<Extent> &ext = *w.op.extents;
    out->clear();
    w.pieces_from = w.extent;
    const Extent &e = ext[w.extent];
    const uint64_t rest = e.bytes - w.extent_cut;
    if (rest >= alone || w.extent + 1 == ext.size()) {
        const uint64_t len = std::min(room, rest);
        out->push_back(Piece{e.src_offset + w.extent_cut, e.dst_offset + w.extent_cut, len});
        w.extent_cut += len;
        if (w.extent_cut == e.bytes) {
            ++w.extent;
            w.extent_cut = 0;
        }
        return;
    }
    uint64_t used = 0;
    while (w.extent < ext.size() && out->size() < kMaxPackedPieces) {
        const Extent &x = ext[w.extent];
        const uint64_t r = x.bytes - w.extent_cut;
        if (r >= alone ||
            packedTableBytes(static_cast<uint32_t>(out->size() + 1)) + used + r > room) {
            break;
        }
        out->push_back(Piece{x.src_offset + w.extent_cut, x.dst_offset + w.extent_cut, r});
        used += r;
        ++w.extent;
        w.extent_cut = 0;
    }
}

void OutLink::rewindPieces(InFlight &w, std::vector<Piece> &pieces) {
    pieces.resize(1);
    w.extent = w.pieces_from + 1;
    w.extent_cut = 0;
}

uint64_t OutLink::writeTable(uint8_t *table, const std::vector<Piece> &pieces) {
    uint64_t sum = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
        encodePackedEntry(table, static_cast<uint32_t>(i), pieces[i].dst_offset, pieces[i].bytes);
        sum += pieces[i].bytes;
    }
    return sum;
}

std::unique_ptr<uint8_t[]> OutLink::packHost(
    const Region &src, const std::vector<Piece> &pieces, uint32_t *len, uint64_t *payload,
    std::vector<std::pair<const uint8_t *, size_t>> *gather) {
    std::unique_ptr<uint8_t[]> buf;
    if (!spare_.empty()) {
        buf = std::move(spare_.back());
        spare_.pop_back();
    } else {
        buf.reset(new (std::nothrow) uint8_t[chunk_bytes_]);  // nextPieces() keeps within it
        if (!buf) {
            return buf;
        }
    }
    const uint64_t sum = writeTable(buf.get(), pieces);
    gather->clear();
    for (const Piece &p : pieces) {
        gather->emplace_back(src.base + p.src_offset, p.bytes);
    }
    *len = static_cast<uint32_t>(packedTableBytes(static_cast<uint32_t>(pieces.size())) + sum);
    *payload = sum;
    return buf;
}

void OutLink::cutStaged(InFlight &w, int slot) {
    uint32_t len = static_cast<uint32_t>(std::min(cutBytes(w), w.op.bytes - w.cut));
    uint64_t advance = len;
    Staged c;
    c.cookie = next_cookie_++;
    c.seq = w.seq;
    c.header.region = w.op.remote_region;
    c.header.write_offset = w.op.dst_offset;
    c.header.total_bytes = w.op.bytes;
    c.header.chunk_offset = w.cut;
    c.header.imm = w.op.imm;
    c.header.flags = w.op.silent ? kChunkSilent : 0;
    const Region &src = *w.op.src;
    if (w.op.extents) {
        // A scattered write from GPU memory: one range, or several small extents copied side
        // by side into the slot behind their table (one completion for all).
        nextPieces(w, chunk_bytes_, &pieces_);
        c.header.flags |= kChunkScatter;
        if (pieces_.size() == 1) {
            len = static_cast<uint32_t>(pieces_[0].bytes);
            advance = len;
            c.header.write_offset = pieces_[0].dst_offset;
            staging_.copy(this, c.cookie, slot, src.cuda.import,
                          src.cuda.alloc_offset + pieces_[0].src_offset, len, /*to_device=*/false);
        } else {
            const auto n = static_cast<uint32_t>(pieces_.size());
            advance = writeTable(staging_.data(slot), pieces_);
            std::vector<TcpStaging::Piece> copies;
            copies.reserve(n);
            uint64_t at = packedTableBytes(n);
            for (const Piece &p : pieces_) {
                copies.push_back(TcpStaging::Piece{static_cast<uint32_t>(at),
                                                   src.cuda.alloc_offset + p.src_offset,
                                                   static_cast<uint32_t>(p.bytes)});
                at += p.bytes;
            }
            len = static_cast<uint32_t>(at);
            c.header.flags |= kChunkPacked;
            c.header.write_offset = n;
            staging_.copyPieces(this, c.cookie, slot, src.cuda.import, copies,
                                /*to_device=*/false);
        }
    } else {
        staging_.copy(this, c.cookie, slot, src.cuda.import,
                      src.cuda.alloc_offset + w.op.src_offset + w.cut, len, /*to_device=*/false);
    }
    c.len = len;
    c.slot = slot;
    staged_.push_back(c);
    w.cut += advance;
    ++w.unsent;
    if (w.cut == w.op.bytes) {
        ++cut_from_;
    }
}

void OutLink::staged(uint64_t cookie, int slot, const Status &st) {
    for (Staged &c : staged_) {
        if (c.cookie == cookie) {
            c.ready = true;
            wants_pump_ = true;
            if (!st.isOk() && staging_error_.empty()) {
                // The receiver expects every byte of the write: a chunk that cannot be read from
                // the GPU ends the session, and its writes fail with this reason.
                staging_error_ = "copying a chunk out of GPU memory failed: " + st.message();
            }
            return;
        }
    }
    staging_.give(slot);
}

int OutLink::pump(int64_t now_ms) {
    wants_pump_ = false;
    // A lone write rotates over the connections as before (kept to the same one, a ping-pong
    // of small writes ran 5 us slower a round trip on the GPU machine); only chunks cut in one
    // pump share one.
    last_conn_ = SIZE_MAX;
    if (!staging_error_.empty()) {
        return 0;  // nothing more leaves: the transport fails the session
    }
    // Each connection holds at most two chunks of ours beyond what the socket took: enough to
    // keep it busy between two turns of the loop, and the cursor does the rest.
    const uint64_t watermark =
        2 * (uint64_t{chunk_bytes_} + kChunkFrameOverhead + kChunkTrailerBytes);
    for (int round = 0; round < kPumpRounds; ++round) {
        bool cut = false;
        for (;;) {
            // GPU chunks are cut ahead into every free slot: their copies run while the sockets
            // send what is ready.
            while (cut_from_ < inflight_.size() && fromGpu(inflight_[cut_from_])) {
                const int slot = staging_.take();
                if (slot < 0) {
                    break;
                }
                cutStaged(inflight_[cut_from_], slot);
                cut = true;
            }
            auto ready = std::find_if(staged_.begin(), staged_.end(),
                                      [](const Staged &c) { return c.ready; });
            const bool host_next = cut_from_ < inflight_.size() && !fromGpu(inflight_[cut_from_]);
            if (ready == staged_.end() && !host_next) {
                break;
            }
            bool small = false;
            if (ready == staged_.end()) {
                const InFlight &w = inflight_[cut_from_];
                // A write of one chunk: the chunks of a longer one spread over the connections.
                small = !w.op.message.empty() ||
                        (!w.op.extents && w.op.bytes < kSmallChunk && w.op.bytes <= cutBytes(w));
            }
            Connection *conn = roomyConnection(watermark, small);
            if (conn == nullptr) {
                break;
            }
            uint8_t head[kChunkFrameOverhead];
            if (ready != staged_.end()) {
                // A staged chunk: its tag is taken now, over the bytes in the slot, and the slot
                // goes back once the socket has taken the whole frame.
                encodeChunkFrame(head, ready->seq, ready->header, ready->len);
                conn->queueChunk(head, staging_.data(ready->slot), ready->len, ready->seq);
                conn_slots_[indexOf(*conn)].push_back(Queued{ready->slot, nullptr});
                staged_.erase(ready);
                cut = true;
                continue;
            }
            InFlight &w = inflight_[cut_from_];
            ChunkHeader h;
            h.region = w.op.remote_region;
            h.write_offset = w.op.dst_offset;
            h.imm = w.op.imm;
            if (!w.op.message.empty()) {
                // A message: one chunk whose data is the message, from the op's own copy (it
                // stays put in inflight_ until the ACK, after the socket took it).
                const auto len = static_cast<uint32_t>(w.op.message.size());
                h.total_bytes = len;
                h.flags = kChunkMessage;
                encodeChunkFrame(head, w.seq, h, len);
                conn->queueChunk(head, w.op.message.data(), len, w.seq);
                conn_slots_[indexOf(*conn)].emplace_back();
                ++w.unsent;
                cut = true;
                ++cut_from_;
                continue;
            }
            h.total_bytes = w.op.bytes;
            h.chunk_offset = w.cut;
            h.flags = w.op.silent ? kChunkSilent : 0;
            uint32_t len = 0;
            uint64_t advance = 0;  // the write's bytes in the chunk (a packed one's table aside)
            const unsigned char *from = nullptr;
            Queued queued;
            std::vector<std::pair<const uint8_t *, size_t>> gather;
            if (w.op.extents) {
                // A scattered write: each chunk says where it lands, one range of one extent
                // or several small extents packed behind a table.
                nextPieces(w, chunk_bytes_, &pieces_);
                h.flags |= kChunkScatter;
                if (pieces_.size() > 1) {
                    queued.buf = packHost(*w.op.src, pieces_, &len, &advance, &gather);
                }
                if (queued.buf) {
                    h.flags |= kChunkPacked;
                    h.write_offset = pieces_.size();
                    from = queued.buf.get();
                } else {
                    if (pieces_.size() > 1) {
                        // No memory for the packed copy: its first extent alone, the rest next.
                        rewindPieces(w, pieces_);
                    }
                    len = static_cast<uint32_t>(pieces_[0].bytes);
                    advance = len;
                    h.write_offset = pieces_[0].dst_offset;
                    from = w.op.src->base + pieces_[0].src_offset;
                }
            } else {
                len = static_cast<uint32_t>(std::min(cutBytes(w), w.op.bytes - w.cut));
                advance = len;
                from = w.op.src->base + w.op.src_offset + w.cut;
            }
            encodeChunkFrame(head, w.seq, h, len);
            // Chunks rotate over the connections so a large write streams over all of them;
            // the target puts the notifications back in sequence order.
            uint8_t *gather_to =
                queued.buf
                    ? queued.buf.get() + packedTableBytes(static_cast<uint32_t>(pieces_.size()))
                    : nullptr;
            conn->queueChunk(head, from, len, w.seq, w.op.extents != nullptr, std::move(gather),
                             gather_to);
            if (tracing()) {
                traceStep("out %s seq %llu chunk at %llu len %u conn %zu", peer_name_.c_str(),
                          static_cast<unsigned long long>(w.seq),
                          static_cast<unsigned long long>(h.chunk_offset), len, indexOf(*conn));
            }
            conn_slots_[indexOf(*conn)].push_back(std::move(queued));
            w.cut += advance;
            ++w.unsent;
            cut = true;
            if (w.cut == w.op.bytes) {
                ++cut_from_;
            }
        }
        bool drained = false;
        for (Connection *c : data_) {
            if (c->hasOutput()) {
                const uint64_t before = c->queuedBytes();
                if (int rc = c->flush(now_ms); rc != 0) {
                    return rc;
                }
                noteSent(*c);
                drained = drained || c->queuedBytes() < before;
            }
        }
        if (!cut || !drained) {
            break;
        }
    }
    // Work left and a socket with room: ask for EPOLLOUT, which fires at once while the socket
    // can take more, so the next turn of the loop cuts on. (A connection whose queue emptied
    // stops asking for it by itself, and nothing else would call us back.) Chunks still being
    // staged call us back through staged() instead.
    const bool ready_left =
        std::any_of(staged_.begin(), staged_.end(), [](const Staged &c) { return c.ready; });
    const bool host_left = cut_from_ < inflight_.size() && !fromGpu(inflight_[cut_from_]);
    if (ready_left || host_left) {
        for (Connection *c : data_) {
            if (c->isOpen() && c->queuedBytes() < watermark) {
                c->setWantWrite(true);
            }
        }
    }
    return 0;
}

void OutLink::noteSent(Connection &c) {
    const size_t ci = indexOf(c);
    for (uint64_t seq : c.takeSent()) {
        if (tracing()) {
            traceStep("out %s seq %llu chunk sent conn %zu", peer_name_.c_str(),
                      static_cast<unsigned long long>(seq), ci);
        }
        if (ci < conn_slots_.size() && !conn_slots_[ci].empty()) {
            Queued &q = conn_slots_[ci].front();
            staging_.give(q.slot);
            if (q.buf && spare_.size() < 2 * data_.size() + 2) {
                spare_.push_back(std::move(q.buf));
            }
            conn_slots_[ci].pop_front();
        }
        if (InFlight *w = find(seq); w != nullptr && w->unsent > 0) {
            --w->unsent;
        }
    }
}

bool OutLink::onAck(uint64_t seq, Code code, bool changed, std::vector<Completion> *out,
                    std::string *error) {
    if (inflight_.empty() || inflight_.front().seq != seq) {
        *error = "ACK for write " + std::to_string(seq) + ", which is not the oldest in flight";
        return false;
    }
    InFlight &f = inflight_.front();
    if (tracing()) {
        traceStep("out %s seq %llu acked code %d", peer_name_.c_str(),
                  static_cast<unsigned long long>(seq), static_cast<int>(code));
    }
    if (f.cut == f.op.bytes && f.unsent != 0) {
        // A worker may have written its last chunk and not yet said so: the target can read,
        // check and acknowledge it first. Its word is waited for (a run ends within
        // TagPool::kSocketRunUs); a send the target cannot have seen yet is taken back.
        for (Connection *c : data_) {
            if (c->awaitSend()) {
                noteSent(*c);
            }
        }
    }
    if (f.cut != f.op.bytes || f.unsent != 0) {
        *error = "ACK for write " + std::to_string(seq) + " before all of it was sent (" +
                 std::to_string(f.cut) + " of " + std::to_string(f.op.bytes) + " bytes cut, " +
                 std::to_string(f.unsent) + " chunk(s) still queued)";
        return false;
    }
    Completion done;
    done.op_id = f.op.op_id;
    done.code = code;
    done.bytes = f.op.bytes;
    if (code != Code::kOk && changed) {
        done.reason =
            "the target received data that did not match its tag (its source changed while it "
            "was sent, or the path altered it): nothing of it landed";
    } else if (code == Code::kNotFound) {
        done.reason =
            "the target refused the write: its region is not exposed, was revoked, "
            "or the write is out of its bounds";
    } else if (code != Code::kOk) {
        done.reason = "the target failed the write";
    }
    out->push_back(std::move(done));
    data_inflight_ -= f.op.message.empty() ? 1 : 0;
    inflight_.pop_front();
    if (cut_from_ > 0) {
        --cut_from_;
    }
    return true;
}

void OutLink::failAll(Code code, const std::string &reason, std::vector<Completion> *out) {
    for (InFlight &f : inflight_) {
        out->push_back(Completion{f.op.op_id, code, reason, f.op.bytes});
    }
    inflight_.clear();
    data_inflight_ = 0;
    cut_from_ = 0;
    // The connections dropped their output first (closeSession): nothing points into the slots
    // queued on them any more. Staged chunks still copying return theirs when they end.
    for (auto &q : conn_slots_) {
        for (const Queued &x : q) {
            staging_.give(x.slot);
        }
        q.clear();
    }
    staging_.forget(this);
    for (Staged &c : staged_) {
        if (c.ready) {
            staging_.give(c.slot);
        }
    }
    staged_.clear();
}

uint64_t OutLink::uncutBytes() const {
    uint64_t n = 0;
    for (size_t i = cut_from_; i < inflight_.size(); ++i) {
        n += inflight_[i].op.bytes - inflight_[i].cut;
    }
    return n;
}

// ----- InLink

InLink::InLink(RegionTable &regions, std::string peer_name, uint32_t max_chunk, size_t window,
               TcpStaging &staging, HostStaging &host, TagPool *tags)
    : regions_(regions),
      peer_name_(std::move(peer_name)),
      max_chunk_(max_chunk),
      window_(window),
      staging_(staging),
      host_(host),
      tags_(tags),
      scratch_(kScratchBytes) {}

InLink::~InLink() {
    stopReads();  // (done already when the session closed: the connections are gone then)
    // No worker may go on reading a region or a slot once we are gone.
    for (Verifying &v : verifying_) {
        tags_->cancelOrWait(*v.job);
        if (v.slot.slot >= 0) {
            staging_.give(v.slot.slot);
        }
        if (v.buf) {
            host_.give(std::move(v.buf));
            host_.endCheck();
        }
    }
    // Copies still running give their slots back when they end; slots of chunks half read are
    // ours to return (their connections are closed).
    staging_.forget(this);
    for (auto &[conn, rs] : rx_slots_) {
        staging_.give(rs.slot);
    }
    for (auto &[conn, buf] : rx_bufs_) {
        host_.give(std::move(buf));
    }
}

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
    const uint64_t seq = h.arg;
    if (seq < next_deliver_ || seq - next_deliver_ >= window_) {
        *error = "write sequence number " + std::to_string(seq) + " outside the window [" +
                 std::to_string(next_deliver_) + ", +" + std::to_string(window_) + ")";
        return EPROTO;
    }
    // The write's record: the existing one, or a new one (not yet inserted: a chunk that must
    // wait for a staging slot leaves no trace, and is decoded again when it is retried).
    RxWrite fresh;
    auto it = pending_.find(seq);
    RxWrite *w = it != pending_.end() ? &it->second : &fresh;
    if ((ch.flags & ~kChunkFlagMask) != 0 || ch.flags == (kChunkSilent | kChunkMessage)) {
        *error = "chunk flags " + std::to_string(ch.flags) + " not known";
        return EPROTO;
    }
    const bool message = (ch.flags & kChunkMessage) != 0;
    const bool scatter = (ch.flags & kChunkScatter) != 0;
    const bool packed = (ch.flags & kChunkPacked) != 0;
    if (scatter && (ch.flags & kChunkSilent) == 0) {
        *error = "a scattered write that is not silent";
        return EPROTO;
    }
    // A packed chunk's write_offset is its table's entry count; the table comes first in its
    // data, and only the rest counts as the write's bytes.
    const uint32_t pieces = packed ? static_cast<uint32_t>(std::min<uint64_t>(
                                         ch.write_offset, kMaxPackedPieces + uint64_t{1}))
                                   : 0;
    if (packed && (!scatter || pieces == 0 || pieces > kMaxPackedPieces ||
                   chunk_len <= packedTableBytes(pieces))) {
        *error = "packed chunk of " + std::to_string(chunk_len) + " bytes with " +
                 std::to_string(ch.write_offset) + " entries (1 to " +
                 std::to_string(kMaxPackedPieces) + ", in a scattered write, table inside)";
        return EPROTO;
    }
    const uint64_t payload = chunk_len - (packed ? packedTableBytes(pieces) : 0);
    if (message && (ch.total_bytes > kMaxMessageBytes || ch.chunk_offset != 0 ||
                    chunk_len != ch.total_bytes)) {
        *error = "message chunk of " + std::to_string(chunk_len) + " bytes at " +
                 std::to_string(ch.chunk_offset) + " for a message of " +
                 std::to_string(ch.total_bytes) + " (at most " + std::to_string(kMaxMessageBytes) +
                 ", in one chunk)";
        return EPROTO;
    }
    if (it == pending_.end()) {
        if (ch.total_bytes == 0) {
            *error = "write of 0 bytes";
            return EPROTO;
        }
        fresh.seq = seq;
        fresh.region_id = ch.region;
        fresh.offset = ch.write_offset;
        fresh.total = ch.total_bytes;
        fresh.imm = ch.imm;
        fresh.flags = ch.flags & ~kChunkPacked;  // a write mixes packed and single-range chunks
        // Checked once per write against the table: exposed, offered to peers (a region exposed
        // without TL_ACCESS_PEERS is never described to them, but its id could be guessed), not
        // revoked, in bounds. A write
        // that fails is still read off the stream, and answered with kNotFound (kCuda when this
        // sidecar cannot stage into the GPU region).
        auto r = regions_.find(ch.region);
        // A message writes nothing into the region: it must be there, offered to us, and its
        // offset inside it, whatever memory it is.
        const bool usable =
            r && (message ||
                  (r->kind == MemoryKind::kCuda ? r->cuda.import != nullptr : r->base != nullptr));
        const bool inside = r && (message   ? fresh.offset <= r->bytes
                                  : scatter ? fresh.total <= r->bytes
                                            : r->contains(fresh.offset, fresh.total));
        if (usable && r->exposed.load(std::memory_order_acquire) && r->access.peers &&
            !r->revoked.load(std::memory_order_acquire) && inside) {
            if (message) {
                fresh.message.resize(fresh.total);
                fresh.region = std::move(r);
            } else if (r->kind == MemoryKind::kCuda &&
                       (!staging_.ensureStarted().isOk() || staging_.slotBytes() < max_chunk_)) {
                fresh.code = Code::kCuda;
            } else {
                fresh.region = std::move(r);
            }
        } else {
            // A region only the verbs transport reaches is there, but not for tcp.
            const bool offered = r && r->exposed.load(std::memory_order_acquire) &&
                                 r->access.peers && !r->revoked.load(std::memory_order_acquire);
            fresh.code = offered && !message && r->dmabufOnly() ? Code::kCuda : Code::kNotFound;
        }
    } else if (w->region_id != ch.region || (!scatter && w->offset != ch.write_offset) ||
               w->total != ch.total_bytes || w->imm != ch.imm ||
               w->flags != (ch.flags & ~kChunkPacked) || message) {
        *error = "chunk of write " + std::to_string(seq) + " disagrees with its first chunk";
        return EPROTO;
    }
    // Bytes claimed by chunks begun, not only those received: two chunks of the same write
    // arriving at once on two connections must not both fit, or the first could deliver and
    // free the record while the second still writes into it.
    if (ch.chunk_offset > w->total || payload > w->total - ch.chunk_offset ||
        payload > w->total - w->claimed) {
        *error = "chunk at " + std::to_string(ch.chunk_offset) + "+" + std::to_string(payload) +
                 " outside write " + std::to_string(seq) + " of " + std::to_string(w->total) +
                 " bytes (" + std::to_string(w->claimed) + " already claimed)";
        return EPROTO;
    }
    // Where the chunk lands in the region: a scattered write's chunk says so itself, and must
    // lie inside it (a write whose chunk does not is refused, its bytes read off the stream). A
    // packed chunk's table is checked once its tag has verified, before any byte lands.
    const uint64_t land = packed ? 0 : scatter ? ch.write_offset : w->offset + ch.chunk_offset;
    if (scatter && !packed && w->code == Code::kOk && !w->region->contains(land, chunk_len)) {
        w->code = Code::kNotFound;  // (the region stays held: another chunk may be landing)
    }
    const bool gpu = w->code == Code::kOk && !message && w->region->kind == MemoryKind::kCuda;
    // A host chunk whose tag must verify first is read into a staging buffer (a GPU one is read
    // into its staging slot anyway; without tags there is nothing to wait for). A message is
    // read into its own buffer, which nobody sees before its tag verified.
    // A packed chunk is always read into one: its table says where its pieces go.
    const bool staged = w->code == Code::kOk && !gpu && !message && (c.authenticated() || packed);
    int slot = -1;
    if (gpu) {
        slot = staging_.take();
        if (slot < 0) {
            blocked_ = true;
            return EBUSY;  // nothing consumed: the header is read again with a slot
        }
    }
    HostStaging::Buffer buf;
    if (staged) {
        if (chunk_len > host_.bufferBytes()) {
            *error = "chunk of " + std::to_string(chunk_len) + " bytes, receive buffers of " +
                     std::to_string(host_.bufferBytes());
            return EPROTO;
        }
        buf = host_.take();
        if (!buf) {
            *error = "no memory for a receive buffer of " + std::to_string(max_chunk_) + " bytes";
            return ENOMEM;
        }
    }
    std::shared_ptr<TagJob> job;
    FrameMac::OneTimeKey head_key{};
    std::array<uint8_t, kChunkFrameOverhead> head{};
    if (c.authenticated()) {
        // The tag covers both headers and the data. A big chunk that lands in memory is checked
        // by the pool once it is all there; else the data is added as it lands.
        const bool lands = w->code == Code::kOk;
        if (lands && tags_ != nullptr &&
            tags_->offloads(kChunkFrameOverhead + chunk_len, scatter) &&
            verifying_.size() < kMaxVerifying) {
            job = std::make_shared<TagJob>();
            job->verify = true;
            job->takeKeys(c.rxAuth());
            std::copy(c.bufferedData(), c.bufferedData() + kChunkFrameOverhead, job->head.begin());
            job->head_len = static_cast<uint32_t>(kChunkFrameOverhead);
            job->len = chunk_len;
        } else {
            head_key = c.rxAuth().beginChunk(kChunkFrameOverhead + chunk_len);
            c.rxAuth().update(c.bufferedData(), kChunkFrameOverhead);
            std::copy(c.bufferedData(), c.bufferedData() + kChunkFrameOverhead, head.begin());
        }
    }
    c.consume(kChunkFrameOverhead);
    if (it == pending_.end()) {
        it = pending_.emplace(seq, std::move(fresh)).first;
        w = &it->second;
    }
    w->claimed += payload;
    if (tracing()) {
        traceStep("in %s seq %llu chunk begun at %llu len %llu", peer_name_.c_str(),
                  static_cast<unsigned long long>(seq),
                  static_cast<unsigned long long>(ch.chunk_offset),
                  static_cast<unsigned long long>(chunk_len));
    }
    c.rx.active = true;
    c.rx.write = w;
    c.rx.remaining = chunk_len;
    c.rx.length = chunk_len;
    c.rx.awaiting_tag = false;
    c.rx.land = nullptr;
    c.rx.pieces = pieces;
    c.rx.head = head;
    c.rx.head_otk = head_key;
    sodium_memzero(head_key.data(), head_key.size());
    if (gpu) {
        const Region &r = *w->region;
        rx_slots_[&c] = RxSlot{slot, r.cuda.alloc_offset + land, seq, pieces};
        c.rx.dest = staging_.data(slot);
    } else if (staged) {
        c.rx.dest = buf.get();
        c.rx.land = w->region->base + land;
        rx_bufs_[&c] = std::move(buf);
    } else if (message) {
        c.rx.dest = w->code == Code::kOk ? w->message.data() : nullptr;
    } else {
        c.rx.dest = w->code == Code::kOk ? w->region->base + land : nullptr;
    }
    c.rx.start = c.rx.dest;
    if (job) {
        job->data = c.rx.start;
        c.rx.job = std::move(job);
    }
    return 0;
}

bool InLink::poolRead(Connection &c) {
    // Chunks read into a receive buffer (host) or a staging slot (GPU), whose tag a worker
    // checks anyway: the worker reads the rest too, so the engine thread copies none of it
    // (docs/peers.md). A host chunk is landed by the worker; a GPU one is copied into device
    // memory from its slot once the worker is done (collectTags()).
    // What the connection's buffer already holds of it is moved first (at most one fill, 64 KiB).
    const bool host = c.rx.land != nullptr;
    if (tags_ == nullptr || !tags_->socketIo() || !c.rx.job ||
        (!host && rx_slots_.find(&c) == rx_slots_.end()) ||
        c.rx.remaining < c.buffered() + TagPool::readFrom()) {
        return false;
    }
    if (!tags_->reserveSocket()) {
        return false;
    }
    if (host && !host_.startCheck()) {
        tags_->releaseSocket();
        return false;
    }
    if (const size_t n = c.buffered(); n > 0) {
        std::memcpy(c.rx.dest, c.bufferedData(), n);
        c.consume(n);
        c.rx.dest += n;
        c.rx.remaining -= n;
    }
    TagJob &job = *c.rx.job;
    job.read_fd = c.fd();
    job.read_to = c.rx.start;
    job.have = c.rx.length - c.rx.remaining;
    job.tag_have = 0;
    c.rx.pooled = true;
    pooled_.push_back(&c);
    return true;
}

void InLink::submitRead(Connection &c) {
    TagJob &job = *c.rx.job;
    auto *w = static_cast<RxWrite *>(c.rx.write);
    // Revoked since: it is still read and checked, and lands nowhere (checked on this thread,
    // so not between here and the submit; quiesceRegion() waits for a run under way).
    if (w->code == Code::kOk && w->region->revoked.load(std::memory_order_acquire)) {
        w->code = Code::kNotFound;
    }
    job.copy_to = w->code == Code::kOk ? c.rx.land : nullptr;
    job.pieces = c.rx.pieces;
    job.region_bytes = w->code == Code::kOk ? w->region->bytes : 0;
    job.good = false;
    job.cancelled = false;
    job.done.store(false, std::memory_order_relaxed);
    c.rx.reading = true;
    c.setWantRead(false);  // the worker owns the socket's input until the run ends
    tags_->submit(c.rx.job);
}

void InLink::stopReads() {
    for (Connection *c : std::exchange(pooled_, {})) {
        if (c->rx.reading) {
            tags_->cancelOrWait(*c->rx.job);
            c->rx.reading = false;
        }
        c->rx.pooled = false;
        c->rx.job->read_fd = -1;
        tags_->releaseSocket();
        if (c->rx.land != nullptr) {
            host_.endCheck();
        }
    }
}

void InLink::checkHere(Connection &c) {
    ChunkRx &rx = c.rx;
    if (!rx.job) {
        return;
    }
    const TagJob &job = *rx.job;
    c.rxAuth().beginWith(job.otk, job.head_len + job.len);
    c.rxAuth().update(job.head.data(), job.head_len);
    std::copy(job.head.begin(), job.head.begin() + kChunkFrameOverhead, rx.head.begin());
    rx.head_otk = job.head_otk;
    c.rxAuth().update(rx.start, rx.length - rx.remaining);
    rx.job.reset();
}

void InLink::landStaged(Connection &c, RxWrite &w) {
    auto it = rx_bufs_.find(&c);
    if (it == rx_bufs_.end()) {
        return;
    }
    // Revoked while it arrived: the owner has taken the memory back (or is about to hear so on
    // this thread), so the bytes are thrown away and the write is answered kNotFound.
    if (w.code == Code::kOk && w.region->revoked.load(std::memory_order_acquire)) {
        w.code = Code::kNotFound;
    }
    if (w.code == Code::kOk) {
        if (c.rx.pieces == 0) {
            std::memcpy(c.rx.land, c.rx.start, c.rx.length);
        } else if (!landPacked(c.rx.land, w.region->bytes, c.rx.start, c.rx.length, c.rx.pieces)) {
            w.code = Code::kNotFound;  // a table that points outside the region: nothing landed
        }
    }
    host_.give(std::move(it->second));
    rx_bufs_.erase(it);
}

bool InLink::tagVerdict(bool good, bool header_good, RxWrite &w, std::string *error) {
    if (good) {
        return true;
    }
    if (!header_good) {
        // Not this connection's next frame: nothing of it reached the region (it is in a
        // staging buffer or slot), nobody is told, and the session is dropped.
        *error = "a chunk fails its authentication tag (injected or corrupted on the way)";
        return false;
    }
    // Only the data changed (its header tag held): the writer changed its source while it was
    // sent, or the path altered it. Nothing of the chunk reaches its target (the caller counts
    // it without landing it), the write fails, and the stream goes on.
    ++chunks_changed_;
    if (w.code == Code::kOk) {
        w.code = Code::kInvalid;
        w.changed = true;
    }
    return true;
}

InLink::Verifying InLink::takeChunk(Connection &c) {
    Verifying v;
    v.job = std::move(c.rx.job);
    v.write = static_cast<RxWrite *>(c.rx.write);
    v.len = c.rx.length - packedTableBytes(c.rx.pieces);  // the write's bytes in it
    if (auto rs = rx_slots_.find(&c); rs != rx_slots_.end()) {
        v.slot = rs->second;
        rx_slots_.erase(rs);
    }
    if (auto rb = rx_bufs_.find(&c); rb != rx_bufs_.end()) {
        v.buf = std::move(rb->second);
        rx_bufs_.erase(rb);
    }
    return v;
}

void InLink::countChunk(RxWrite &w, uint64_t len, const RxSlot *slot) {
    if (tracing()) {
        traceStep("in %s seq %llu chunk checked len %llu", peer_name_.c_str(),
                  static_cast<unsigned long long>(w.seq), static_cast<unsigned long long>(len));
    }
    if (slot != nullptr) {
        // Revoked since its bytes came (the owner has heard so, on this thread): nothing of it
        // reaches device memory.
        if (w.code == Code::kOk && w.region->revoked.load(std::memory_order_acquire)) {
            w.code = Code::kNotFound;
        }
        if (w.code == Code::kOk && slot->pieces != 0) {
            // A packed chunk: its table (authenticated in the slot with the rest) says where
            // each piece goes; a bad one lands nothing.
            std::vector<TcpStaging::Piece> pieces;
            const Region &r = *w.region;
            const bool good = forEachPackedPiece(
                staging_.data(slot->slot), len + packedTableBytes(slot->pieces), slot->pieces,
                r.bytes, [&](uint64_t dst, uint64_t at, uint64_t bytes) {
                    pieces.push_back(TcpStaging::Piece{static_cast<uint32_t>(at),
                                                       r.cuda.alloc_offset + dst,
                                                       static_cast<uint32_t>(bytes)});
                });
            if (good) {
                const uint64_t cookie = next_cookie_++;
                copies_[cookie] = RxCopy{slot->seq, len};
                staging_.copyPieces(this, cookie, slot->slot, r.cuda.import, pieces,
                                    /*to_device=*/true);
                return;
            }
            w.code = Code::kNotFound;
        }
        if (w.code == Code::kOk) {
            // Authenticated in the slot; it counts once it is in device memory (staged()).
            const uint64_t cookie = next_cookie_++;
            copies_[cookie] = RxCopy{slot->seq, len};
            staging_.copy(this, cookie, slot->slot, w.region->cuda.import, slot->device_offset,
                          static_cast<uint32_t>(len), /*to_device=*/true);
            return;
        }
        staging_.give(slot->slot);  // revoked while it arrived: the bytes were thrown away
    }
    w.received += len;
}

int InLink::collectTags(int64_t now_ms, std::string *error, std::vector<Connection *> *resume) {
    for (auto it = pooled_.begin(); it != pooled_.end();) {
        Connection &c = **it;
        TagJob &job = *c.rx.job;
        const bool done = c.rx.reading && job.done.load(std::memory_order_acquire);
        if (!done && !(c.rx.reading && job.read_done.load(std::memory_order_acquire))) {
            ++it;
            continue;
        }
        c.rx.reading = false;
        c.bytes_in += std::exchange(job.read_bytes, 0);
        c.last_rx_ms = now_ms;
        if (!done) {
            // Read to its end, tag and all: its worker checks and lands it while this
            // connection reads the next frame (the chunk counts once the check is done, below).
            it = pooled_.erase(it);
            tags_->releaseSocket();
            verifying_.push_back(takeChunk(c));  // its host check (poolRead()) goes with it
            c.rx = ChunkRx{};
            c.setWantRead(true);
            resume->push_back(&c);
            continue;
        }
        if (job.read_error != 0) {
            *error = job.read_error == ECONNRESET ? "data connection closed by the peer"
                                                  : "data connection: " + errnoText(job.read_error);
            return job.read_error;  // the session goes; stopReads() gives the places back
        }
        c.rx.remaining = c.rx.length - job.have;
        c.rx.dest = c.rx.start + job.have;
        c.setWantRead(true);
        resume->push_back(&c);
        if (job.cancelled || !job.readComplete()) {
            ++it;  // the socket ran dry: more is read (by a worker again) once epoll says so
            continue;
        }
        auto *w = static_cast<RxWrite *>(c.rx.write);
        if (!tagVerdict(job.good, job.header_good, *w, error)) {
            return EPROTO;
        }
        it = pooled_.erase(it);
        tags_->releaseSocket();
        const uint64_t len = c.rx.length - packedTableBytes(c.rx.pieces);
        if (auto rs = rx_slots_.find(&c); rs != rx_slots_.end()) {
            // A GPU chunk, authenticated in its slot: now copied into device memory.
            const RxSlot slot = rs->second;
            rx_slots_.erase(rs);
            c.rx = ChunkRx{};
            countChunk(*w, len, &slot);
            continue;
        }
        host_.endCheck();
        if (!job.landed && w->code == Code::kOk) {
            w->code = Code::kNotFound;  // a packed chunk's bad table: nothing landed
        }
        if (auto rb = rx_bufs_.find(&c); rb != rx_bufs_.end()) {
            host_.give(std::move(rb->second));  // the worker copied it into the region
            rx_bufs_.erase(rb);
        }
        countChunk(*w, len, nullptr);
        c.rx = ChunkRx{};
    }
    for (auto it = verifying_.begin(); it != verifying_.end();) {
        if (!it->job->done.load(std::memory_order_acquire)) {
            ++it;
            continue;
        }
        if (!tagVerdict(it->job->good, it->job->header_good, *it->write, error)) {
            return EPROTO;  // nothing of it counts; the session goes (the destructor cleans up)
        }
        Verifying v = std::move(*it);
        it = verifying_.erase(it);
        if (v.buf) {
            if (!v.job->landed && v.write->code == Code::kOk) {
                v.write->code = Code::kNotFound;  // a packed chunk's bad table: nothing landed
            }
            host_.give(std::move(v.buf));  // the job copied it into the region
            host_.endCheck();
        }
        countChunk(*v.write, v.len, v.slot.slot >= 0 ? &v.slot : nullptr);
    }
    return 0;
}

void InLink::quiesceRegion(RegionId r, const std::vector<Connection *> &conns) {
    for (Connection *c : pooled_) {
        // A worker reading a chunk for it copies it into the region if its run completes it:
        // that run ends (or is taken back) now; the next one lands nothing (submitRead()).
        if (c->rx.reading && static_cast<RxWrite *>(c->rx.write)->region_id == r) {
            tags_->cancelOrWait(*c->rx.job);
        }
    }
    for (Connection *c : conns) {
        // A chunk read into a staging buffer is not in the region: it goes on, and sees the
        // revocation when it would be copied (landStaged()).
        // (A GPU chunk a worker reads goes on into its slot, checked by the worker; countChunk()
        // sees the revocation and copies nothing into device memory.)
        if (c != nullptr && c->rx.active && !c->rx.pooled && c->rx.job && c->rx.land == nullptr &&
            static_cast<RxWrite *>(c->rx.write)->region_id == r) {
            checkHere(*c);  // the next read sees the revocation and stops writing
        }
    }
    for (Verifying &v : verifying_) {
        if (v.write->region_id == r && v.slot.slot < 0) {
            // Its worker copies it into the region once the tag verified: that copy ends now,
            // before the owner knows.
            tags_->finishNow(*v.job);
        }
    }
}

int InLink::finishChunk(Connection &c, int64_t now_ms, std::string *error) {
    if (c.authenticated()) {
        if (c.buffered() < kChunkTrailerBytes) {
            c.rx.awaiting_tag = true;
            const int rc = c.fillAtLeast(kChunkTrailerBytes, now_ms);
            if (rc != 0) {
                return rc;  // EAGAIN: epoll reports the rest
            }
            if (c.buffered() < kChunkTrailerBytes) {
                return EAGAIN;
            }
        }
        if (c.rx.job && c.rx.land != nullptr && !host_.startCheck()) {
            checkHere(c);  // as many host chunks as allowed are with the workers: checked here
        }
        if (c.rx.job) {
            // The pool checks it while we read on; it counts in collectTags().
            std::copy(c.bufferedData(), c.bufferedData() + kChunkTrailerBytes,
                      c.rx.job->tag.begin());
            c.consume(kChunkTrailerBytes);
            Verifying v = takeChunk(c);
            if (v.buf) {
                // The worker copies it into the region once the tag verified. Revoked since
                // (on this thread, so not between this check and the submit): only checked.
                if (v.write->code == Code::kOk &&
                    v.write->region->revoked.load(std::memory_order_acquire)) {
                    v.write->code = Code::kNotFound;
                }
                if (v.write->code == Code::kOk) {
                    v.job->copy_to = c.rx.land;
                    v.job->pieces = c.rx.pieces;
                    v.job->region_bytes = v.write->region->bytes;
                }
            }
            tags_->submit(v.job);
            verifying_.push_back(std::move(v));
            c.rx = ChunkRx{};
            return 0;
        }
        const bool good = c.rxAuth().verify(c.bufferedData());
        const bool header_good = good || FrameAuth::headerTagMatches(
                                             c.rx.head_otk, c.rx.head.data(), kChunkFrameOverhead,
                                             c.bufferedData() + kFrameTagBytes);
        c.consume(kChunkTrailerBytes);
        if (!tagVerdict(good, header_good, *static_cast<RxWrite *>(c.rx.write), error)) {
            return EPROTO;
        }
    }
    auto *w = static_cast<RxWrite *>(c.rx.write);
    if (c.rx.land != nullptr) {
        landStaged(c, *w);
    }
    const uint64_t len = c.rx.length - packedTableBytes(c.rx.pieces);
    if (auto rs = rx_slots_.find(&c); rs != rx_slots_.end()) {
        const RxSlot slot = rs->second;
        rx_slots_.erase(rs);
        countChunk(*w, len, &slot);
    } else {
        countChunk(*w, len, nullptr);
    }
    c.rx = ChunkRx{};
    return 0;
}

void InLink::staged(uint64_t cookie, int slot, const Status &st) {
    staging_.give(slot);
    auto it = copies_.find(cookie);
    if (it == copies_.end()) {
        return;
    }
    const RxCopy cp = it->second;
    copies_.erase(it);
    auto w = pending_.find(cp.seq);
    if (w == pending_.end()) {
        return;
    }
    if (!st.isOk() && w->second.code == Code::kOk) {
        w->second.code = Code::kCuda;  // the writer hears that the target could not take it
    }
    w->second.received += cp.len;
}

int InLink::onReadable(Connection &c, size_t budget, int64_t now_ms, std::string *error) {
    if (c.rx.reading) {
        return 0;  // a worker reads it; collectTags() hands it back
    }
    if (c.rx.pooled) {
        submitRead(c);  // the socket is readable again: the rest (perhaps only the tag's) is next
        return 0;
    }
    size_t used = 0;
    const uint64_t in_before = c.bytes_in;
    while (used < budget) {
        if (!c.rx.active) {
            if (c.buffered() < kChunkFrameOverhead) {
                if (c.bytes_in != in_before && c.drainedLastRead()) {
                    // Our last read in this call emptied the socket: another would only say
                    // EAGAIN (a system call on every message's path); epoll, level-triggered,
                    // reports the next bytes.
                    return 0;
                }
                // Where a tag worker may read the chunk, the header and at most kReadAhead
                // more are read here (else a fill reads up to 64 KiB of its data on this
                // thread, and a chunk of 128 KiB, a 512 KiB write's over two connections,
                // would not have enough left for one); a small message comes whole, tag and
                // all, in one read.
                const bool worker_may_read =
                    tags_ != nullptr && tags_->socketIo() && c.authenticated();
                int rc =
                    c.fillAtLeast(kChunkFrameOverhead, now_ms,
                                  worker_may_read ? kChunkFrameOverhead + kReadAhead : SIZE_MAX);
                if (rc == EAGAIN) {
                    return 0;
                }
                if (rc != 0) {
                    return rc;
                }
                continue;
            }
            int rc = beginChunk(c, error);
            if (rc == EBUSY) {
                return 0;  // waits for a staging slot; the transport reads us again
            }
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
                return EINPROGRESS;
            }
            // A region revoked mid-write takes no more bytes (a chunk in the middle of a readv
            // may still finish: the shared_ptr keeps that memory mapped). A chunk read into a
            // staging buffer goes on there: it is not copied into the region (landStaged()).
            if (rx.dest != nullptr && rx.land == nullptr &&
                w->region->revoked.load(std::memory_order_acquire)) {
                checkHere(c);  // the rest goes to scratch, which the pool cannot see
                rx.dest = nullptr;
                w->code = Code::kNotFound;
            }
            if (poolRead(c)) {
                submitRead(c);
                return 0;
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
            if (c.authenticated() && !rx.job) {
                c.rxAuth().update(dest, got);
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
        const int rc = finishChunk(c, now_ms, error);
        if (rc == EAGAIN) {
            return 0;
        }
        if (rc != 0) {
            return rc;
        }
    }
    return EINPROGRESS;
}

bool InLink::deliverable() const {
    if (pending_.empty()) {
        return false;
    }
    const auto &[seq, w] = *pending_.begin();
    return seq == next_deliver_ && w.received == w.total;
}

}  // namespace tensorlane::sidecar
