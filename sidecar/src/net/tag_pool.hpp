// Frame tags off the engine thread. Poly1305 over a 1 MiB chunk costs about as much as the
// socket copy of it, and one engine thread does the copies of every connection: with the tag
// on it too, tagged tcp bandwidth stayed well below what the sockets carry. A TagPool is a few
// worker threads that sign outgoing chunks and verify incoming ones while the engine goes on
// with the socket (docs/peers.md, "Frame integrity").
//
// The engine thread takes each frame's one-time keys in wire order (TagJob::takeKeys()), hands
// the job over, and picks the result up later: a sender's flush stops before the tag bytes of a
// frame whose tag is not there yet; a receiver counts a chunk only once its tag has verified,
// and a host chunk, checked in its receive buffer, is copied into its region by the worker only
// then (TagJob::copy_to).
// The job's data must stay valid until it is done: whoever frees that memory first calls
// cancelOrWait() (a queued job is taken back, a running one waited for; a job costs tens of
// microseconds).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "net/frame.hpp"
#include "net/frame_auth.hpp"
#include "tensorlane/ipc/fd.hpp"

namespace tensorlane::sidecar {

/// One frame's tag to compute (sign) or check (verify).
struct TagJob {
    FrameMac::OneTimeKey otk{};
    /// The header tag's key (FrameAuth::nextChunkKeys()): sign computes the header tag into the
    /// trailer's second half; verify checks it only when the frame's tag failed.
    FrameMac::OneTimeKey head_otk{};
    std::array<uint8_t, kChunkFrameOverhead> head{};
    uint32_t head_len = 0;
    const uint8_t *data = nullptr;
    size_t len = 0;
    bool verify = false;
    /// verify: where the `len` bytes at `data` are copied once the tag has verified (by whoever
    /// computes it, before `done`); null: nothing is copied. A chunk for a host region is read
    /// into a staging buffer and reaches the region only this way (docs/peers.md).
    uint8_t *copy_to = nullptr;
    /// verify, a packed chunk (net/packed_chunk.hpp): `copy_to` is the region's first byte,
    /// `region_bytes` its size, and the pieces are copied where the chunk's table says.
    uint32_t pieces = 0;
    uint64_t region_bytes = 0;
    /// verify with `pieces`: false when the table was bad (nothing was copied).
    bool landed = true;
    /// sign: ranges copied one after the other to `gather_to` (inside `data`) before the tag
    /// is taken: a packed chunk's extents, gathered by the worker (the frame's data waits).
    std::vector<std::pair<const uint8_t *, size_t>> gather;
    uint8_t *gather_to = nullptr;
    /// sign: written by the worker; verify: what came with the frame. The frame's trailer
    /// (kChunkTrailerBytes): its tag, then its header tag.
    std::array<uint8_t, kChunkTrailerBytes> tag{};
    /// verify, read by the worker (TagPool::kReadFrom): the socket the rest of the chunk's data
    /// and then its tag come from, read into `read_to` (the buffer `data` points at) and `tag`
    /// without blocking the worker for long (at most kSocketWaitUs at a time, kSocketRunUs in
    /// all). -1: every byte is there.
    int read_fd = -1;
    uint8_t *read_to = nullptr;
    /// With `read_fd`: the bytes of the data and of the tag that are there (in: where reading
    /// goes on; out: how far it got). The tag is checked (and the chunk copied) only once both
    /// are whole; a run that ends short leaves `good` false and is submitted again.
    size_t have = 0;
    size_t tag_have = 0;
    /// Out, with `read_fd`: bytes this run read, and the errno that ended reading (ECONNRESET:
    /// the peer closed the stream).
    size_t read_bytes = 0;
    int read_error = 0;
    /// Takes the next chunk frame's keys from `auth` (its number, in wire order).
    void takeKeys(FrameAuth &auth) {
        FrameAuth::ChunkKeys keys = auth.nextChunkKeys();
        otk = keys.data;
        head_otk = keys.head;
        sodium_memzero(&keys, sizeof keys);
    }
    /// With `read_fd`: whether data and tag are whole.
    bool readComplete() const { return have == len && tag_have == kChunkTrailerBytes; }
    /// With `read_fd`: the frame's Poly1305 goes on as its bytes are read (`tagged` of the data
    /// added so far), so that when the last byte is in only the last read's bytes are left to
    /// check. A run that ends short leaves that state here for the next run, which may be
    /// another worker's (null while a worker's own state serves).
    std::unique_ptr<FrameMac> mac;
    bool mac_started = false;
    size_t tagged = 0;
    /// With `read_fd`: set (release) once the data and the tag are all read and before the check
    /// and the landing copy run, after which the worker never touches the socket again: its
    /// owner may read the next frame from it meanwhile (wait for `done` for the chunk itself).
    std::atomic<bool> read_done{false};
    /// sign, sent by the worker (TagPool::kWriteFrom): the socket the whole frame (`head`,
    /// `data`, `tag`) goes to once its tag is there, without blocking the worker for long (as
    /// reads). -1: the connection sends it.
    int write_fd = -1;
    /// With `write_fd`: the tag is in `tag` already (only the sending is left).
    bool tag_ready = false;
    /// With `write_fd`: bytes of the frame written so far (in: where writing goes on), and out:
    /// the errno that ended writing, whether the run ended on a full socket (the connection
    /// waits for EPOLLOUT before it goes on).
    size_t sent = 0;
    int write_error = 0;
    bool write_stalled = false;
    size_t frameBytes() const { return head_len + len + kChunkTrailerBytes; }
    /// verify's answer, once done (a cancelled job is not good).
    bool good = false;
    /// verify, when not `good`: whether the header tag held (only the data changed: the write
    /// fails and the stream goes on; else the session goes).
    bool header_good = false;
    /// Taken back before a worker ran it (cancelOrWait()): `tag`/`good` mean nothing.
    bool cancelled = false;
    /// When it was submitted (set only while the step trace is on).
    std::chrono::steady_clock::time_point queued_at{};
    /// Set (release) when the worker has finished with the job: read `tag`/`good` after an
    /// acquire load of it.
    std::atomic<bool> done{false};
};

/// Copies `pieces` one after the other to `to` (a packed chunk's gather).
inline void gatherInto(uint8_t *to, const std::vector<std::pair<const uint8_t *, size_t>> &pieces) {
    for (const auto &[p, n] : pieces) {
        std::memcpy(to, p, n);
        to += n;
    }
}

class TagPool {
public:
    /// Frames smaller than this are tagged where they are: handing them over costs more than
    /// the tag. (The smallest chunk a mid-sized write is cut into, cutLength(), is 32 KiB: its
    /// chunks are tagged side by side.)
    static constexpr size_t kOffloadFrom = 32 * 1024;
    /// The same for the chunks of a scattered write (a grouped write's entries, one chunk per
    /// entry of often 16 KiB): they come in a stream, so the workers tag them side by side
    /// while the engine moves on (on the 16-core GPU machine a 1,000-entry group took 2.6x a
    /// 16 MiB write with every tag on the engine thread).
    static constexpr size_t kBulkOffloadFrom = 8 * 1024;
    /// The most workers one pool runs.
    static constexpr unsigned kMaxThreads = 16;
    /// A host chunk with at least this much data still to come is read from its socket by a
    /// worker (TagJob::read_fd), which then checks its tag and copies it into its region: the
    /// engine thread does none of the chunk's socket copies.
    static constexpr size_t kReadFrom = 64 * 1024;
    /// kReadFrom, or TENSORLANE_TAG_READ_FROM=BYTES in the sidecar's environment (an
    /// experiment's knob, docs/peers.md; at least 4 KiB).
    static size_t readFrom();
    /// How long a worker reading or writing a socket waits for it at a time, and works on it in
    /// all, before it hands the rest back (the engine submits it again when epoll sees the
    /// socket ready): a peer that stops mid-chunk holds a worker for at most this long. A
    /// worker whose socket would block hands it back at once while other jobs are queued, so a
    /// job waits for a worker at most one wait (kSocketWaitUs), never a whole run.
    /// (Until 2026-12-07: 500 us and 4 ms, and no look at the queue: with traffic both ways the
    /// tag jobs that send the next bytes could wait behind workers waiting for the peer's.)
    static constexpr unsigned kSocketWaitUs = 50;
    static constexpr unsigned kSocketRunUs = 1000;
    /// A chunk frame with at least this much data left to send is written to its socket by a
    /// worker (TagJob::write_fd), the one that signs it when it is the queue's head by then.
    static constexpr size_t kWriteFrom = 64 * 1024;
    /// A frame a worker tags and sends goes out in pieces of at least this much (a quarter of
    /// it, page-rounded, when that is more), each sent once it is tagged.
    static constexpr size_t kSendPiece = 32 * 1024;

    /// The workers `[tcp] tag_threads = "auto"` gives on a host with `cpus` CPUs: none below
    /// four (the engine threads and the applications want them), then one per four, at most
    /// four.
    static unsigned autoThreads(unsigned cpus);

    /// Starts `threads` workers (0: every tag stays on the caller's thread). `spin_us`: how
    /// long an idle worker looks for the next job before it sleeps (0: it sleeps at once; a
    /// sleeping worker costs the submitter a futex wake and the job the wake-up's latency).
    /// `socket_io`: whether workers read and write sockets for big chunks (kReadFrom,
    /// kWriteFrom); false keeps every socket copy on the connections' thread.
    explicit TagPool(unsigned threads, unsigned spin_us = 0, bool socket_io = true);
    /// Stops and joins the workers; jobs still queued are cancelled.
    ~TagPool();
    TagPool(const TagPool &) = delete;
    TagPool &operator=(const TagPool &) = delete;

    unsigned threads() const { return static_cast<unsigned>(workers_.size()); }
    /// Whether workers take socket reads and writes of big chunks (a pool with workers).
    bool socketIo() const { return socket_io_ && !workers_.empty(); }
    /// Whether a frame of `frame_bytes` goes to the workers (`bulk`: a scattered write's).
    bool offloads(size_t frame_bytes, bool bulk = false) const {
        return !workers_.empty() && frame_bytes >= (bulk ? kBulkOffloadFrom : kOffloadFrom);
    }

    /// Queues `job`. When a worker has done it, `done` is set and wakeFd() becomes readable.
    void submit(std::shared_ptr<TagJob> job);
    /// Makes sure no worker uses `job` any more: takes it back if it is still queued (it is
    /// then done and `cancelled`, and wakeFd() becomes readable), else waits until its worker
    /// has finished it. For teardown.
    void cancelOrWait(TagJob &job);

    /// Waits for `job` if a worker runs it now. False when it is still queued (left there).
    bool waitIfRunning(TagJob &job);

    /// Takes one of the places for jobs that read or write a socket (one per worker but one,
    /// so a pool of two or more always has a worker for tags alone); false when all are taken.
    /// Give it back with releaseSocket().
    bool reserveSocket();
    void releaseSocket();
    /// Makes sure `job` is done, with its real result: computes it on the calling thread if it
    /// is still queued, else waits for its worker. For memory about to change under it. Either
    /// way wakeFd() becomes readable, as when a worker ends a job.
    void finishNow(TagJob &job);

    /// Readable while jobs have ended since the last clearWake() (an eventfd; -1 without
    /// workers).
    int wakeFd() const { return wake_.get(); }
    void clearWake();

    /// Jobs finished by the workers (status, tests).
    uint64_t jobsDone() const { return jobs_done_.load(std::memory_order_relaxed); }
    /// Chunks whose data and tag workers read from their sockets to the end (status, tests).
    uint64_t readsDone() const { return reads_done_.load(std::memory_order_relaxed); }
    /// Chunk frames workers wrote to their sockets to the end (status, tests). A frame whose
    /// socket filled up with less than kWriteFrom left is finished by its connection.
    uint64_t sendsDone() const { return sends_done_.load(std::memory_order_relaxed); }
    /// Bytes workers wrote to sockets.
    uint64_t bytesSent() const { return bytes_sent_.load(std::memory_order_relaxed); }

private:
    void run();
    void compute(FrameMac &mac, TagJob &job);
    /// Waits (holding `lock` on mutex_) until a worker is done with `job`.
    void waitDone(std::unique_lock<std::mutex> &lock, const TagJob &job);
    /// Reads what a reading job still lacks from its socket (TagJob::read_fd), adding the data
    /// to `mac` as it comes.
    void readRest(TagJob &job, FrameMac &mac);
    /// Whether jobs are queued for a worker (a worker whose socket would block hands it back
    /// rather than wait while they do).
    bool othersWaiting() const { return queued_.load(std::memory_order_acquire) != 0; }
    /// verify: checks the frame's tag (and, if it failed, its header tag) and lands the chunk
    /// where it is good.
    static void checkAndLand(FrameMac &mac, TagJob &job);
    /// sign: the frame's trailer (its tag from `mac`, then its header tag), then the keys wiped.
    static void finishSign(FrameMac &mac, TagJob &job);
    static void wipeKeys(TagJob &job);
    /// A reading job: reads the rest, then checks the tag and lands the chunk.
    void readAndCheck(FrameMac &mac, TagJob &job);
    /// Writes what a writing job has not sent yet to its socket (TagJob::write_fd).
    void writeRest(TagJob &job);
    /// Sends the frame's bytes up to `limit` (headers, data, tag, counted together): false when
    /// it stopped short (a full socket: with `wait`, after waiting as writeRest() does; an
    /// error: `write_error`).
    bool sendUpTo(TagJob &job, size_t limit, bool wait);
    /// A writing job whose tag is not there yet: tags the data a piece at a time and sends
    /// each piece once it is tagged, then the rest and the tag.
    void signAndSend(FrameMac &mac, TagJob &job);
    /// Wakes the owners of ended jobs.
    void signalDone();
    /// Where `job` is in the queue (under mutex_), or queue_.end().
    std::deque<std::shared_ptr<TagJob>>::iterator findQueued(const TagJob &job);
    /// Takes `job` out of the queue (under mutex_); null when no worker is to run it any more.
    std::shared_ptr<TagJob> takeQueued(const TagJob &job);
    /// A job that will never run.
    static void cancel(TagJob &job);

    std::mutex mutex_;
    std::condition_variable work_cv_;
    std::condition_variable done_cv_;
    std::deque<std::shared_ptr<TagJob>> queue_;
    bool stop_ = false;
    unsigned sleeping_ = 0;              ///< workers in work_cv_.wait (under mutex_)
    std::atomic<size_t> queued_{0};      ///< queue_.size(), for spinning workers
    std::atomic<bool> stopping_{false};  ///< stop_, for spinning workers
    const unsigned spin_us_ = 0;
    const bool socket_io_ = true;
    std::atomic<uint64_t> jobs_done_{0};
    std::atomic<unsigned> sockets_{0};
    std::atomic<uint64_t> reads_done_{0};
    std::atomic<uint64_t> sends_done_{0};
    std::atomic<uint64_t> bytes_sent_{0};
    ipc::UniqueFd wake_;
    std::vector<std::thread> workers_;
};

}  // namespace tensorlane::sidecar
