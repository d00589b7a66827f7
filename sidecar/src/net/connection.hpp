// One non-blocking peer TCP connection: an input buffer with frame parsing, a zero-copy read
// path into region memory, and an output queue flushed with one gathered send. Plus the epoll
// wrapper that routes readiness to connections by token.
//
// Output goes out with sendmsg(MSG_NOSIGNAL) scatter-gather; input of chunk data is read with
// readv into the memory the receiver names (a receive buffer or staging slot while the chunk's
// tag is to be checked, the target itself without tags).
#pragma once

#include <sys/epoll.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "net/frame.hpp"
#include "net/frame_auth.hpp"
#include "net/tag_pool.hpp"
#include "tensorlane/ipc/fd.hpp"
#include "tensorlane/sidecar/transport.hpp"

namespace tensorlane::sidecar {

class Connection;

/// An epoll set. Connections register themselves under a token (>= kFirstConnectionToken);
/// smaller tokens are the owner's fixed fds (listener, timer, eventfds).
class Poller {
public:
    static constexpr uint64_t kFirstConnectionToken = 64;

    /// Creates the epoll fd. Returns 0 or errno.
    int open();
    int fd() const { return ep_.get(); }
    int add(int fd, uint32_t events, uint64_t token);
    int modify(int fd, uint32_t events, uint64_t token);
    void remove(int fd);
    /// Waits up to `timeout_ms` (0: poll). Returns the count or -1 (errno set).
    int wait(epoll_event *events, int max, int timeout_ms);

    /// The connection registered under `token`, or nullptr (it was closed meanwhile).
    Connection *find(uint64_t token) const;
    /// No connection is registered (fixed fds are not counted).
    bool noConnections() const { return conns_.empty(); }

private:
    friend class Connection;
    uint64_t attach(Connection *c);
    void detach(uint64_t token);

    ipc::UniqueFd ep_;
    std::unordered_map<uint64_t, Connection *> conns_;
    uint64_t next_token_ = kFirstConnectionToken;
};

/// What a connection is for; the owner routes its events by this.
enum class ConnRole : uint8_t {
    kPendingIn,   ///< accepted, not yet authenticated
    kInControl,   ///< a peer's control connection to us
    kInData,      ///< a peer's data connection to us (carries its writes)
    kOutControl,  ///< our control connection to a peer
    kOutData,     ///< our data connection to a peer (carries our writes)
};

/// The chunk a data connection is in the middle of receiving.
struct ChunkRx {
    bool active = false;
    void *write = nullptr;      ///< the receiver's record of the whole write
    uint8_t *dest = nullptr;    ///< where the next byte goes; nullptr: discard it
    uint64_t remaining = 0;     ///< bytes of this chunk still to come
    uint64_t length = 0;        ///< the chunk's data bytes
    bool awaiting_tag = false;  ///< all data came; its FrameAuth tag is next
    /// Set when the chunk's tag is checked by a TagPool worker: its key and headers, the data
    /// from `start` (submitted once the tag has come). Null: checked here as the data lands.
    std::shared_ptr<TagJob> job;
    uint8_t *start = nullptr;
    /// Set when the chunk is read into a staging buffer (at `start`) because its tag must verify
    /// before any byte reaches its target: where the chunk goes then. Null: read in place.
    uint8_t *land = nullptr;
    /// A packed chunk (net/packed_chunk.hpp): its table's entries (`land` is then the region's
    /// first byte, and the pieces go where the table says). 0: one range.
    uint32_t pieces = 0;
    /// The rest of the chunk (data and tag) is read from the socket by a TagPool worker
    /// (`job`, TagJob::read_fd), which checks it and lands it: nothing of it is buffered here.
    bool pooled = false;
    /// A worker is reading it now: the connection is not read here (nor polled for input).
    bool reading = false;
    /// Checked here (no `job`): the headers and the header tag's key, for the header tag that
    /// is checked only when the chunk's tag fails (kChunkTrailerBytes).
    std::array<uint8_t, kChunkFrameOverhead> head{};
    FrameMac::OneTimeKey head_otk{};
};

/// A connected, non-blocking TCP socket registered with a Poller. Move-only by pointer: the
/// Poller holds its address, so it lives in a unique_ptr.
class Connection {
public:
    /// Registers `fd` with the poller (readable; also writable while `connecting`).
    Connection(Poller &poller, ipc::UniqueFd fd, std::string remote, ConnRole role, int64_t now_ms,
               bool connecting);
    ~Connection();
    Connection(const Connection &) = delete;
    Connection &operator=(const Connection &) = delete;

    int fd() const { return fd_.get(); }
    uint64_t token() const { return token_; }
    /// The remote address, for logs.
    const std::string &remote() const { return remote_; }
    bool isOpen() const { return static_cast<bool>(fd_); }
    /// Deregisters and closes the socket; the object stays valid (owners destroy it later).
    void close();
    /// Moves the connection to another poller (the peer layer hands authenticated data
    /// connections to the tcp transport, which polls its own set).
    void rebind(Poller &poller);
    /// Tags every later frame in both directions (after the handshake; see frame_auth.hpp).
    void enableAuth(const FrameAuth::Key &tx_key, const FrameAuth::Key &rx_key);
    bool authenticated() const { return rx_auth_.enabled(); }
    /// The receiving direction's tag state (the chunk reader updates it as data lands).
    FrameAuth &rxAuth() { return rx_auth_; }
    /// Where big chunk frames get their tags (null: on this thread). The pool must outlive the
    /// connection.
    void setTagPool(TagPool *pool) { tags_ = pool; }
    TagPool *tagPool() const { return tags_; }

    // Routing fields, set by the owner.
    ConnRole role;
    PeerId peer = 0;
    uint32_t index = 0;  ///< data connection index
    bool connecting = false;

    // ----- output
    /// Queues a frame, copying the payload.
    void queueFrame(FrameType type, uint64_t arg, std::span<const uint8_t> payload = {});
    /// Queues a chunk frame: its header is copied, `data` is sent from where it lies (it must
    /// stay valid until sent or dropOutput()). `tag_id` (non-zero) is reported by takeSent()
    /// once the whole frame has been written to the socket. A big frame's tag is computed by
    /// the tag pool: flush() sends up to it and goes on once it is there.
    /// `gather` (a packed chunk's extents): copied one after the other to `gather_to` inside
    /// `data` before the frame goes out, by the tag worker that signs it (its data waits for
    /// it) or here.
    void queueChunk(const uint8_t *head, const uint8_t *data, uint32_t len, uint64_t tag_id = 0,
                    bool bulk = false, std::vector<std::pair<const uint8_t *, size_t>> gather = {},
                    uint8_t *gather_to = nullptr);
    /// The tag_ids of chunks written out completely since the last call.
    std::vector<uint64_t> takeSent() { return std::exchange(sent_, {}); }
    /// Writes queued bytes until the socket is full or `budget` bytes went. Returns 0 or errno.
    int flush(int64_t now_ms, size_t budget = SIZE_MAX);
    bool hasOutput() const { return !out_.empty(); }
    uint64_t queuedBytes() const { return out_bytes_; }
    /// Waits for the worker writing the queue's head if one is at it now, and counts what it
    /// wrote. True when there was one (a job not started yet stays queued). An error it met is
    /// returned by the next flush().
    bool awaitSend();
    /// Forgets queued output (the connection is being torn down); tags still being computed
    /// over it are waited for, so its memory may go once this returns.
    void dropOutput();
    /// The queue's head waits for a tag from the pool, or a worker sends it (the pool's
    /// wake-up brings us back; EPOLLOUT is not asked for meanwhile).
    bool waitingForTag() const { return waiting_tag_; }

    // ----- input
    enum class Parse { kFrame, kNeedMore, kBad };
    /// Reads what the socket has into the buffer. 0 when bytes came, EAGAIN when none,
    /// ECONNRESET at end of stream, else errno.
    int fill(int64_t now_ms, size_t at_most = SIZE_MAX);
    /// The next whole frame in the buffer. The payload view stays valid until consumeFrame().
    Parse nextFrame(uint32_t max_payload, FrameHeader *header, std::span<const uint8_t> *payload,
                    std::string *error);
    /// Drops the frame nextFrame() returned (and its tag, if it had one then: turning
    /// authentication on while handling a frame does not change what it spans).
    void consumeFrame(const FrameHeader &) { consume(std::exchange(frame_bytes_, 0)); }
    size_t buffered() const { return wpos_ - rpos_; }
    const uint8_t *bufferedData() const { return in_.data() + rpos_; }
    void consume(size_t n);
    /// Makes room and reads until at least `want` bytes are buffered or the socket is empty.
    /// `at_most`: no byte beyond the first `at_most` buffered is read (what follows a chunk's
    /// header and a little more stays in the socket for a tag worker to read: InLink).
    int fillAtLeast(size_t want, int64_t now_ms, size_t at_most = SIZE_MAX);
    /// Whether the last read here (fill, fillAtLeast, readInto) got less than it asked for: the
    /// socket was empty then, and (level-triggered) epoll reports it again when bytes come.
    bool drainedLastRead() const { return drained_; }
    /// Moves up to `len` bytes to `dest`: the buffered ones first, then straight from the socket
    /// (readv), bytes beyond `len` landing in the buffer so the next header costs no extra call.
    /// `*got` may be less than len. Returns 0, EAGAIN (nothing at all), ECONNRESET, or errno.
    int readInto(uint8_t *dest, size_t len, size_t *got, int64_t now_ms);

    ChunkRx rx;

    // ----- liveness and counters
    int64_t last_rx_ms = 0;
    int64_t last_tx_ms = 0;
    /// The last time queued output shrank (a stalled peer shows as output that never moves).
    int64_t last_out_progress_ms = 0;
    uint64_t bytes_in = 0;
    uint64_t bytes_out = 0;

    /// Wants EPOLLOUT (set while output is queued or a connect is in progress).
    void setWantWrite(bool want);
    /// Wants EPOLLIN (off while a TagPool worker reads the socket: ChunkRx::reading).
    void setWantRead(bool want);

private:
    struct OutItem {
        std::array<uint8_t, kChunkFrameOverhead + kFrameTagBytes> head{};
        uint32_t head_len = 0;
        std::vector<uint8_t> big;  ///< a frame too large for `head` (tag included)
        const uint8_t *data = nullptr;
        size_t data_len = 0;
        std::array<uint8_t, kChunkTrailerBytes> tag{};  ///< a chunk's trailer, when tag_len
        uint32_t tag_len = 0;
        std::shared_ptr<TagJob> job;  ///< computing `tag` in the pool (null once copied)
        bool data_waits = false;      ///< `job` also fills `data` (a gather): send it after
        uint64_t tag_id = 0;
        size_t sent = 0;
        size_t size() const { return (big.empty() ? head_len : big.size()) + data_len + tag_len; }
    };

    Poller *poller_;
    ipc::UniqueFd fd_;
    std::string remote_;
    uint64_t token_ = 0;
    bool want_write_ = false;
    bool want_read_ = true;
    bool drained_ = false;
    /// The epoll events wanted now.
    uint32_t events() const;
    std::vector<uint8_t> in_;
    size_t rpos_ = 0;
    size_t wpos_ = 0;
    std::deque<OutItem> out_;
    uint64_t out_bytes_ = 0;
    std::vector<uint64_t> sent_;
    /// The queue's head, being written to the socket by a tag worker (TagJob::write_fd): nothing
    /// else is sent meanwhile. It holds one of the pool's socket places.
    std::shared_ptr<TagJob> send_job_;
    int send_error_ = 0;  ///< the errno a worker's send ended with, for the next flush()
    /// Hands the rest of the queue's head to a worker when it is a big chunk whose tag is there
    /// (kSent), or says to wait for its tag (kWait) and then do so; kNo: it is sent here.
    enum class PoolSend { kNo, kSent, kWait };
    /// A chunk frame with enough left to send that a worker sends it (TagPool::kWriteFrom).
    bool poolable(const OutItem &item) const;
    PoolSend poolSend();
    /// Takes the worker's send back: what it wrote counts. 0 or the errno that ended it.
    int settleSend(size_t *written);
    /// Waits for (or takes back) the jobs of workers that use the socket.
    void stopSocketJobs();
    size_t frame_bytes_ = 0;  ///< what the frame nextFrame() returned spans
    FrameAuth tx_auth_;
    FrameAuth rx_auth_;
    TagPool *tags_ = nullptr;
    bool waiting_tag_ = false;
};

}  // namespace tensorlane::sidecar
