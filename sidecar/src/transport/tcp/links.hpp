// The TCP data path of one authenticated session: the sending side (OutLink: writes cut into
// chunks as the sockets drain, striped over the data connections, completed by the target's
// ACKs) and the receiving side (InLink: chunks read into a staging buffer and copied into the
// target region once their tags have verified, or straight into it without tags; writes
// delivered in sequence order, each one notified before it is acknowledged).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "net/connection.hpp"
#include "tensorlane/sidecar/region.hpp"
#include "tensorlane/sidecar/status.hpp"
#include "tensorlane/sidecar/trace.hpp"
#include "tensorlane/sidecar/transport.hpp"
#include "transport/set.hpp"
#include "transport/tcp/staging.hpp"

namespace tensorlane::sidecar {

/// How long the chunks of a write of `write_bytes` are over `connections` connections:
/// `chunk_bytes`, or less (at least 32 KiB) for a write of under 2 x connections chunks, so that
/// its stages overlap. `busy`: other writes to the peer are in flight, whose stages the write's
/// overlap already; then its chunks are at least 256 KiB (or `chunk_bytes`, if less): a write
/// no longer goes whole.
uint64_t cutLength(uint64_t write_bytes, size_t connections, uint32_t chunk_bytes,
                   bool busy = false);

/// The sender's half: sequence numbers, chunking, striping, in-flight bookkeeping.
///
/// A write is not cut into chunks when it is posted: it keeps a cursor, and chunks are cut
/// from the oldest unfinished write only while a data connection has less than two chunks
/// queued. So memory per peer is bounded whatever the writes' sizes (a 1 TiB write costs a
/// handful of queue items, not 2^28), and the striping follows the sockets that drain.
///
/// A write from a GPU region is cut ahead into staging slots (as many as the pool has): each
/// chunk is copied device-to-host by the stager and goes on a connection once it is there
/// (its FrameAuth tag is taken over the staged bytes), and its slot comes back once the
/// socket has taken the whole frame. So the copy of chunk k+1 overlaps the send of chunk k.
class OutLink final : public StagingClient {
public:
    /// `data` are the session's authenticated data connections (owned by the transport, which
    /// keeps them for as long as this link); `staging` the send pool for GPU sources.
    OutLink(std::vector<Connection *> data, uint32_t chunk_bytes, size_t window,
            TcpStaging &staging);
    ~OutLink() override;

    /// The target's node name, for the step trace (tensorlane/sidecar/trace.hpp).
    void setPeerName(std::string name) { peer_name_ = std::move(name); }

    /// Queues `op` (its remote_region resolved) and starts sending unless `send_now` is false
    /// (the caller pumps soon: the next post, or its own pump()). kAgain when `window` writes are
    /// already in flight. Never blocks.
    Status post(const WriteOp &op, int64_t now_ms, bool send_now = true);

    /// Cuts chunks into connections with room and sends. Returns 0 or the errno of a failed
    /// connection.
    int pump(int64_t now_ms);

    /// Notes the chunks `c` has written out completely (after a flush).
    void noteSent(Connection &c);

    /// The target ended write `seq` with `code`. False with `*error` when that is a protocol
    /// error: not the oldest write in flight (targets acknowledge in order), or a write whose
    /// chunks have not all left yet (the target cannot have received them: the source memory
    /// may still be read for them).
    bool onAck(uint64_t seq, Code code, bool changed, std::vector<Completion> *out,
               std::string *error);

    /// Ends every write in flight with `code` (the session died). Call after the connections
    /// dropped their queued output, which points into the writes' source regions.
    void failAll(Code code, const std::string &reason, std::vector<Completion> *out);

    size_t inFlight() const { return inflight_.size(); }
    /// Bytes posted and not yet cut into chunks (tests and status).
    uint64_t uncutBytes() const;

    // StagingClient: a chunk's device-to-host copy ended.
    void staged(uint64_t cookie, int slot, const Status &st) override;
    /// A staged chunk became ready since the last pump (the transport pumps then).
    bool wantsPump() const { return wants_pump_; }
    /// Why staging failed (the transport fails the session); empty while all is well.
    const std::string &stagingError() const { return staging_error_; }

private:
    struct InFlight {
        uint64_t seq = 0;
        WriteOp op;
        uint64_t cut = 0;     ///< bytes cut into chunks so far
        uint32_t unsent = 0;  ///< chunks cut and not yet written out (staged ones included)
        size_t extent = 0;    ///< a scattered write: the extent being cut
        uint64_t extent_cut = 0;
        size_t pieces_from = 0;  ///< the extent of the last nextPieces()'s first piece
    };
    /// A chunk of a GPU write, from its cut until it goes on a connection.
    struct Staged {
        uint64_t cookie = 0;
        uint64_t seq = 0;
        ChunkHeader header;
        uint32_t len = 0;
        int slot = -1;
        bool ready = false;  ///< its bytes are in the slot
    };
    /// The write with this sequence number, or nullptr.
    InFlight *find(uint64_t seq);
    /// The next connection with room for another chunk, or nullptr. A `small` chunk (a message,
    /// a write of one chunk under kSmallChunk) goes where the chunk before it in the same pump()
    /// went while that connection has less than kSmallChunk queued: small ones posted together
    /// (tl_write_msg's data and its payload record, held by WriteOp::more; a group's small
    /// entries) leave in one sendmsg and reach the target in one read, instead of one socket
    /// each.
    Connection *roomyConnection(uint64_t watermark, bool small);
    static constexpr uint64_t kSmallChunk = 64 << 10;
    size_t indexOf(const Connection &c) const;
    static bool fromGpu(const InFlight &w) {
        return w.op.bytes != 0 && w.op.src->kind == MemoryKind::kCuda;
    }
    /// One range of a scattered write's next chunk.
    struct Piece {
        uint64_t src_offset = 0;
        uint64_t dst_offset = 0;
        uint64_t bytes = 0;
    };
    /// The ranges the next chunk of scattered write `w` carries, at most `room` bytes with
    /// their table, and moves its extent cursor past them: several whole small extents (a
    /// packed chunk, kChunkPacked), else one piece of one extent (kChunkScatter alone).
    void nextPieces(InFlight &w, uint64_t room, std::vector<Piece> *out);
    /// Takes back all but the first of the pieces nextPieces() gave (each packed piece is the
    /// whole rest of its extent, so the cursor goes to the extent after the first's).
    void rewindPieces(InFlight &w, std::vector<Piece> &pieces);
    /// Writes the packed table of `pieces` at `table`; returns the bytes they carry.
    static uint64_t writeTable(uint8_t *table, const std::vector<Piece> &pieces);
    /// A buffer for a packed chunk from host source `src` with its table written; the pieces'
    /// bytes are to be copied behind it (`*gather`: by the tag worker that signs the chunk, or
    /// by the connection). Null when there is no memory for it; else `*len` is the chunk's
    /// size and `*payload` the write's bytes in it.
    std::unique_ptr<uint8_t[]> packHost(const Region &src, const std::vector<Piece> &pieces,
                                        uint32_t *len, uint64_t *payload,
                                        std::vector<std::pair<const uint8_t *, size_t>> *gather);
    /// Cuts the next chunk of the write at cut_from_ into `slot` and starts its copy.
    void cutStaged(InFlight &w, int slot);
    /// How long the chunks of `w` are (chunk_bytes, or less for a write of a few chunks).
    uint64_t cutBytes(const InFlight &w) const;

    std::vector<Connection *> data_;
    uint32_t chunk_bytes_;
    size_t window_;
    TcpStaging &staging_;
    std::string peer_name_;
    uint64_t next_seq_ = 1;
    size_t next_conn_ = 0;
    size_t last_conn_ = SIZE_MAX;  ///< index in data_ of the connection of the last chunk
    std::deque<InFlight> inflight_;
    size_t data_inflight_ = 0;   ///< of inflight_, the writes with data (not messages)
    size_t cut_from_ = 0;        ///< index in inflight_ of the oldest write not cut completely
    std::deque<Staged> staged_;  ///< GPU chunks cut and not yet on a connection, in cut order
    /// What a chunk queued on a connection holds until the socket has taken it: its staging
    /// slot (-1: none), or the buffer of a packed chunk from host memory.
    struct Queued {
        int slot = -1;
        std::unique_ptr<uint8_t[]> buf;
    };
    /// Per data connection, one per chunk queued on it, in queue order: takeSent() reports the
    /// chunks in that order, and then the slot is free again and the buffer goes.
    std::vector<std::deque<Queued>> conn_slots_;
    /// Scratch of nextPieces().
    std::vector<Piece> pieces_;
    /// Packed chunks' buffers (chunk_bytes each) that the sockets are done with, for reuse.
    std::vector<std::unique_ptr<uint8_t[]>> spare_;
    uint64_t next_cookie_ = 1;
    bool wants_pump_ = false;
    std::string staging_error_;
};

/// The receiver's half for one peer session.
///
/// On an authenticated connection no byte reaches a region before its frame's tag has
/// verified: a chunk for a host region is read into a buffer of the HostStaging pool, and
/// copied into the region once the tag is good (a chunk whose tag fails changes nothing). With a
/// tag pool, a big chunk's tag is checked (and the chunk copied into its region) by a worker
/// while the engine reads the next one; the chunk counts (or starts its copy into the GPU) only
/// when collectTags() sees it done. A region revoked while such chunks are checked is quiesced
/// first (quiesceRegion()): their copies are finished before its owner hears of it, so nothing
/// is written into memory its owner has taken back. Without tags (`tcp_integrity = "none"`)
/// chunks are read straight into the region: nothing is checked, and nothing protects it.
///
/// A chunk for a GPU region is read into a staging slot of the receive pool (and authenticated
/// there as it lands), then copied host-to-device by the stager while the next chunk arrives;
/// the write counts as received only once all of its chunks are in device memory. With no slot
/// free, the connection's next chunk waits (blocked(): the transport reads it again once a copy
/// has ended).
class InLink final : public StagingClient {
public:
    /// `tags` (may be null: every tag checked here) and `host` must outlive the link; `host`'s
    /// buffers hold a chunk of `max_chunk` bytes.
    InLink(RegionTable &regions, std::string peer_name, uint32_t max_chunk, size_t window,
           TcpStaging &staging, HostStaging &host, TagPool *tags = nullptr);
    ~InLink() override;

    /// Reads chunk frames from data connection `c`, at most about `budget` bytes. Returns 0
    /// (the socket is drained: epoll says when more comes), EINPROGRESS (the budget is used:
    /// call again, as bytes may already sit in the connection's buffer, where epoll cannot see
    /// them), ECONNRESET/errno on a socket error, or EPROTO with `*error` set when the peer broke
    /// the protocol.
    int onReadable(Connection &c, size_t budget, int64_t now_ms, std::string *error);

    /// Reports the writes that are complete, in sequence order: arrived() for those that landed,
    /// then an ACK through `ack` (so the writer's completion follows the owner's notification).
    template <class AckFn>
    size_t deliver(EventSink &sink, AckFn &&ack);
    /// True when deliver() has something to do.
    bool deliverable() const;

    /// Counts the chunks whose tags the pool has checked since the last call, and takes back
    /// the connections whose chunks workers were reading (`*resume`: read them again). 0, or
    /// with `*error` set EPROTO when a tag failed, ECONNRESET or another errno when a worker's
    /// read failed (the session must go).
    int collectTags(int64_t now_ms, std::string *error, std::vector<Connection *> *resume);
    /// Chunks whose tags the pool is checking, and chunks its workers read.
    size_t verifying() const { return verifying_.size() + pooled_.size(); }
    /// Takes every chunk a worker reads back from the pool (waiting for running reads): call
    /// before the connections close, as the workers read their sockets.
    void stopReads();
    /// Region `r` was revoked (before its owner hears of it): chunks landing in it check their
    /// tags here from now on, and checks of chunks already in it are finished now.
    void quiesceRegion(RegionId r, const std::vector<Connection *> &conns);

    uint64_t writesReceived() const { return writes_received_; }
    /// Chunks whose data failed its tag while their header tag held (tagVerdict()).
    uint64_t chunksChanged() const { return chunks_changed_; }
    uint64_t bytesReceived() const { return bytes_received_; }

    // StagingClient: a chunk's host-to-device copy ended.
    void staged(uint64_t cookie, int slot, const Status &st) override;
    /// A chunk waits for a staging slot (read the connections again after dispatch()).
    bool blocked() const { return blocked_; }
    void clearBlocked() { blocked_ = false; }

private:
    struct RxWrite {
        std::shared_ptr<Region> region;  ///< keeps the memory mapped while bytes land
        uint64_t seq = 0;                ///< its sequence number (the trace's)
        uint64_t region_id = 0;
        uint64_t offset = 0;
        uint64_t total = 0;
        uint64_t claimed = 0;   ///< bytes of chunks begun (at most total)
        uint64_t received = 0;  ///< bytes of chunks finished, authenticated (and on the GPU)
        uint32_t imm = 0;
        uint32_t flags = 0;  ///< ChunkFlag bits of its first chunk
        Code code = Code::kOk;
        /// A chunk's data failed its tag (tagVerdict()): the ACK says so.
        bool changed = false;
        /// kChunkMessage: the message's bytes (total of them), read here, never into the region.
        std::vector<uint8_t> message;
    };
    /// The chunk a connection reads into a staging slot.
    struct RxSlot {
        int slot = -1;
        uint64_t device_offset = 0;  ///< from the allocation's first byte
        uint64_t seq = 0;            ///< the write's sequence number
        uint32_t pieces = 0;         ///< a packed chunk: its table's entries (device_offset unused)
    };
    /// A chunk being copied into device memory.
    struct RxCopy {
        uint64_t seq = 0;
        uint64_t len = 0;
    };
    /// A chunk that landed and whose tag a worker checks.
    struct Verifying {
        std::shared_ptr<TagJob> job;
        RxWrite *write = nullptr;  ///< stays in pending_: it cannot complete before this counts
        uint64_t len = 0;
        RxSlot slot;              ///< slot >= 0: a GPU chunk in a staging slot
        HostStaging::Buffer buf;  ///< a host chunk's staging buffer (the job copies it out)
    };
    /// Most chunks whose tags are checked at once; beyond, tags are checked on this thread.
    static constexpr size_t kMaxVerifying = 64;
    /// Where tag workers may read chunks, bytes read past a chunk's header on this thread: a
    /// small message (NCCL's 4 KiB steps) comes with its tag in one read, and a big chunk
    /// leaves nearly all of itself in the socket for a worker.
    static constexpr size_t kReadAhead = 16 * 1024;

    /// Whether the rest of the chunk `c` reads goes to a pool worker (taking its places).
    bool poolRead(Connection &c);
    /// Hands the rest of the chunk to a worker (again), which reads, checks and lands it.
    void submitRead(Connection &c);
    /// Starts receiving the chunk whose frame header is buffered in `c`.
    int beginChunk(Connection &c, std::string *error);
    /// The chunk's data all came: check its tag (authenticated connections) and count it.
    int finishChunk(Connection &c, int64_t now_ms, std::string *error);
    /// A checked chunk's fate: true to count it (a good tag; or data that failed its tag while
    /// the header tag held, which fails its write, kInvalid and `changed`, and lands nothing);
    /// false, with `*error`, when the session must go.
    bool tagVerdict(bool good, bool header_good, RxWrite &w, std::string *error);
    /// The chunk connection `c` holds (its job, write, slot or buffer) as a check in flight.
    Verifying takeChunk(Connection &c);
    /// An authenticated chunk's bytes are all in: count them (host), or start their copy into
    /// the GPU (`slot` set).
    void countChunk(RxWrite &w, uint64_t len, const RxSlot *slot);
    /// The chunk `c` is reading stops being checked by the pool: its tag is computed here, over
    /// what has landed so far and what follows.
    static void checkHere(Connection &c);
    /// A host chunk's tag verified: copies it from its staging buffer into its region (unless
    /// the write was refused or revoked meanwhile) and returns the buffer.
    void landStaged(Connection &c, RxWrite &w);

    RegionTable &regions_;
    std::string peer_name_;
    uint32_t max_chunk_;
    uint64_t window_;
    TcpStaging &staging_;
    HostStaging &host_;
    TagPool *tags_;
    std::deque<Verifying> verifying_;
    /// Connections whose chunk the pool reads (ChunkRx::pooled): each holds a reader place of
    /// the pool and a check of `host_` until its chunk lands.
    std::vector<Connection *> pooled_;
    std::unordered_map<const Connection *, RxSlot> rx_slots_;
    /// The staging buffer of each connection reading a host chunk.
    std::unordered_map<const Connection *, HostStaging::Buffer> rx_bufs_;
    std::unordered_map<uint64_t, RxCopy> copies_;  ///< by cookie
    uint64_t next_cookie_ = 1;
    bool blocked_ = false;
    std::map<uint64_t, RxWrite> pending_;  ///< by sequence number; node addresses are stable
    uint64_t next_deliver_ = 1;
    std::vector<uint8_t> scratch_;  ///< where rejected writes' bytes are read to
    uint64_t writes_received_ = 0;
    uint64_t bytes_received_ = 0;
    uint64_t chunks_changed_ = 0;
};

template <class AckFn>
size_t InLink::deliver(EventSink &sink, AckFn &&ack) {
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
            if ((w.flags & kChunkMessage) != 0) {
                sink.messageArrived(w.region_id, w.imm, w.offset, w.message, peer_name_);
            } else {
                if ((w.flags & kChunkSilent) == 0) {
                    sink.arrived(w.region_id, w.imm, w.offset, w.total, peer_name_);
                }
                bytes_received_ += w.total;
            }
            ++writes_received_;
        }
        if (tracing()) {
            traceStep("in %s seq %llu delivered code %d", peer_name_.c_str(),
                      static_cast<unsigned long long>(it->first), static_cast<int>(code));
        }
        ack(it->first, code, w.changed);
        pending_.erase(it);
        ++next_deliver_;
        ++n;
    }
    return n;
}

}  // namespace tensorlane::sidecar
