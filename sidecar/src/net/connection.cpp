#include "net/connection.hpp"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>

namespace tensorlane::sidecar {

namespace {

// Big enough that a readv which finishes one chunk's payload also picks up the next headers
// and small payloads; small enough to keep thousands of connections cheap.
constexpr size_t kInputBufferBytes = 64 * 1024;
// sendmsg takes at most IOV_MAX (1024) iovecs; 64 items (two iovecs each) stay well under it.
constexpr size_t kMaxIovPerWrite = 128;

}  // namespace

std::string frameTypeName(uint8_t type) {
    switch (static_cast<FrameType>(type)) {
        case FrameType::kHello:
            return "HELLO";
        case FrameType::kChallenge:
            return "CHALLENGE";
        case FrameType::kAuth:
            return "AUTH";
        case FrameType::kReady:
            return "READY";
        case FrameType::kRefuse:
            return "REFUSE";
        case FrameType::kRegionAdd:
            return "REGION_ADD";
        case FrameType::kRegionDel:
            return "REGION_DEL";
        case FrameType::kAck:
            return "ACK";
        case FrameType::kHeartbeat:
            return "HEARTBEAT";
        case FrameType::kSelect:
            return "SELECT";
        case FrameType::kSelected:
            return "SELECTED";
        case FrameType::kTransport:
            return "TRANSPORT";
        case FrameType::kChunk:
            return "CHUNK";
    }
    char buf[16];
    std::snprintf(buf, sizeof buf, "type 0x%02x", type);
    return buf;
}

// ----- Poller

int Poller::open() {
    int fd = ::epoll_create1(EPOLL_CLOEXEC);
    if (fd < 0) {
        return errno;
    }
    ep_.reset(fd);
    return 0;
}

int Poller::add(int fd, uint32_t events, uint64_t token) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = token;
    return ::epoll_ctl(ep_.get(), EPOLL_CTL_ADD, fd, &ev) == 0 ? 0 : errno;
}

int Poller::modify(int fd, uint32_t events, uint64_t token) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = token;
    return ::epoll_ctl(ep_.get(), EPOLL_CTL_MOD, fd, &ev) == 0 ? 0 : errno;
}

void Poller::remove(int fd) {
    ::epoll_ctl(ep_.get(), EPOLL_CTL_DEL, fd, nullptr);
}

int Poller::wait(epoll_event *events, int max, int timeout_ms) {
    return ::epoll_wait(ep_.get(), events, max, timeout_ms);
}

Connection *Poller::find(uint64_t token) const {
    auto it = conns_.find(token);
    return it == conns_.end() ? nullptr : it->second;
}

uint64_t Poller::attach(Connection *c) {
    const uint64_t token = next_token_++;
    conns_.emplace(token, c);
    return token;
}

void Poller::detach(uint64_t token) {
    conns_.erase(token);
}

// ----- Connection

Connection::Connection(Poller &poller, ipc::UniqueFd fd, std::string remote, ConnRole r,
                       int64_t now_ms, bool is_connecting)
    : role(r),
      connecting(is_connecting),
      last_rx_ms(now_ms),
      last_tx_ms(now_ms),
      last_out_progress_ms(now_ms),
      poller_(&poller),
      fd_(std::move(fd)),
      remote_(std::move(remote)),
      in_(kInputBufferBytes) {
    token_ = poller_->attach(this);
    want_write_ = is_connecting;
    // Level-triggered: a connection with more input than one progress() budget is reported
    // again on the next epoll_wait, so nothing is lost when we stop early.
    poller_->add(fd_.get(), events(), token_);
}

void Connection::rebind(Poller &poller) {
    if (fd_) {
        poller_->remove(fd_.get());
        poller_->detach(token_);
    }
    poller_ = &poller;
    token_ = poller_->attach(this);
    if (fd_) {
        poller_->add(fd_.get(), events(), token_);
    }
}

void Connection::enableAuth(const FrameAuth::Key &tx_key, const FrameAuth::Key &rx_key) {
    tx_auth_ = FrameAuth(tx_key);
    rx_auth_ = FrameAuth(rx_key);
}

Connection::~Connection() {
    close();
    dropOutput();  // no tag job may go on reading what the queue points at
}

void Connection::stopSocketJobs() {
    if (tags_ == nullptr) {
        return;
    }
    if (send_job_) {
        tags_->cancelOrWait(*send_job_);
    }
    if (rx.reading && rx.job) {
        tags_->cancelOrWait(*rx.job);  // (its owner, the InLink, takes the result back)
    }
}

void Connection::close() {
    // No worker may go on reading or writing the socket's number once it is closed.
    stopSocketJobs();
    if (fd_) {
        poller_->remove(fd_.get());
        poller_->detach(token_);
        fd_.reset();
    }
}

void Connection::setWantWrite(bool want) {
    if (want == want_write_ || !fd_) {
        return;
    }
    want_write_ = want;
    poller_->modify(fd_.get(), events(), token_);
}

void Connection::setWantRead(bool want) {
    if (want == want_read_ || !fd_) {
        return;
    }
    want_read_ = want;
    poller_->modify(fd_.get(), events(), token_);
}

uint32_t Connection::events() const {
    return (want_read_ ? EPOLLIN | EPOLLRDHUP : 0u) | (want_write_ ? EPOLLOUT : 0u);
}

void Connection::queueFrame(FrameType type, uint64_t arg, std::span<const uint8_t> payload) {
    OutItem item;
    const size_t tag = tx_auth_.enabled() ? kFrameTagBytes : 0;
    const size_t total = kFrameHeaderBytes + payload.size() + tag;
    uint8_t *p = nullptr;
    if (total <= item.head.size()) {
        p = item.head.data();
        item.head_len = static_cast<uint32_t>(total);
    } else {
        item.big.resize(total);
        p = item.big.data();
    }
    encodeFrameHeader(p, type, static_cast<uint32_t>(payload.size()), arg);
    std::copy(payload.begin(), payload.end(), p + kFrameHeaderBytes);
    if (tag != 0) {
        tx_auth_.sign(p, kFrameHeaderBytes + payload.size(), nullptr, 0,
                      p + kFrameHeaderBytes + payload.size());
    }
    out_bytes_ += item.size();
    out_.push_back(std::move(item));
}

void Connection::queueChunk(const uint8_t *head, const uint8_t *data, uint32_t len, uint64_t tag_id,
                            bool bulk, std::vector<std::pair<const uint8_t *, size_t>> gather,
                            uint8_t *gather_to) {
    OutItem item;
    std::copy(head, head + kChunkFrameOverhead, item.head.begin());
    item.head_len = static_cast<uint32_t>(kChunkFrameOverhead);
    item.data = data;
    item.data_len = len;
    item.tag_id = tag_id;
    if (tx_auth_.enabled()) {
        item.tag_len = kChunkTrailerBytes;
        if (tags_ != nullptr && tags_->offloads(kChunkFrameOverhead + len, bulk)) {
            // The frame number is taken now, in queue order; a worker computes the tag while
            // the socket takes the headers and the data.
            auto job = std::make_shared<TagJob>();
            job->takeKeys(tx_auth_);
            std::copy(head, head + kChunkFrameOverhead, job->head.begin());
            job->head_len = static_cast<uint32_t>(kChunkFrameOverhead);
            job->data = data;
            job->len = len;
            if (!gather.empty()) {
                job->gather = std::move(gather);
                job->gather_to = gather_to;
                item.data_waits = true;
            }
            // The queue's head: the worker that signs it sends it too.
            if (out_.empty() && !send_job_ && len >= TagPool::kWriteFrom && fd_ &&
                tags_->reserveSocket()) {
                job->write_fd = fd_.get();
                send_job_ = job;
            }
            item.job = job;
            tags_->submit(std::move(job));
        } else {
            gatherInto(gather_to, gather);
            // One pass over the source, right before it goes out (warm for the send).
            tx_auth_.signChunk(head, kChunkFrameOverhead, data, len, item.tag.data());
        }
    } else {
        gatherInto(gather_to, gather);
    }
    out_bytes_ += item.size();
    out_.push_back(std::move(item));
}

void Connection::dropOutput() {
    if (send_job_) {
        tags_->cancelOrWait(*send_job_);
        send_job_.reset();
        tags_->releaseSocket();
    }
    for (OutItem &item : out_) {
        if (item.job && tags_ != nullptr) {
            tags_->cancelOrWait(*item.job);
        }
    }
    waiting_tag_ = false;
    out_.clear();
    out_bytes_ = 0;
    sent_.clear();
}

bool Connection::poolable(const OutItem &item) const {
    return tags_ != nullptr && tags_->socketIo() && item.tag_len != 0 && item.big.empty() &&
           item.sent + TagPool::kWriteFrom <= item.head_len + item.data_len;
}

Connection::PoolSend Connection::poolSend() {
    if (out_.empty() || send_job_ || !poolable(out_.front())) {
        return PoolSend::kNo;
    }
    OutItem &front = out_.front();
    if (front.job && !front.job->done.load(std::memory_order_acquire)) {
        return PoolSend::kWait;  // its tag comes soon, and then a worker sends it
    }
    if (!tags_->reserveSocket()) {
        return PoolSend::kNo;
    }
    if (front.job) {
        front.tag = front.job->tag;
        front.job.reset();
    }
    auto job = std::make_shared<TagJob>();
    job->head = {};
    std::copy(front.head.begin(), front.head.begin() + front.head_len, job->head.begin());
    job->head_len = front.head_len;
    job->data = front.data;
    job->len = front.data_len;
    job->tag = front.tag;
    job->tag_ready = true;
    job->write_fd = fd_.get();
    job->sent = front.sent;
    send_job_ = job;
    tags_->submit(std::move(job));
    return PoolSend::kSent;
}

bool Connection::awaitSend() {
    if (!send_job_ || !tags_->waitIfRunning(*send_job_)) {
        return false;
    }
    size_t written = 0;
    if (int rc = settleSend(&written); rc != 0) {
        send_error_ = rc;
    }
    // Still waiting: the pool's wake-up at the job's end brings flush() back.
    waiting_tag_ = true;
    return true;
}

int Connection::settleSend(size_t *written) {
    std::shared_ptr<TagJob> job = std::exchange(send_job_, nullptr);
    tags_->releaseSocket();
    OutItem &front = out_.front();
    if (front.job == job) {
        if (!job->tag_ready) {
            return 0;  // taken back before it ran (teardown): nothing was signed or sent
        }
        front.tag = job->tag;
        front.job.reset();
    }
    if (job->cancelled) {
        return 0;
    }
    const size_t advance = job->sent - front.sent;
    front.sent = job->sent;
    bytes_out += advance;
    out_bytes_ -= advance;
    *written += advance;
    if (job->write_error != 0) {
        return job->write_error;
    }
    if (front.sent == front.size()) {
        if (front.tag_id != 0) {
            sent_.push_back(front.tag_id);
        }
        out_.pop_front();
    }
    return 0;
}

int Connection::flush(int64_t now_ms, size_t budget) {
    if (!fd_) {
        return EBADF;
    }
    if (send_error_ != 0) {
        return send_error_;
    }
    size_t written_total = 0;
    waiting_tag_ = false;
    bool stalled = false;
    if (send_job_) {
        if (!send_job_->done.load(std::memory_order_acquire)) {
            waiting_tag_ = true;  // a worker writes the head; the pool wakes us when it is done
            setWantWrite(false);
            return 0;
        }
        stalled = send_job_->write_stalled;
        if (int rc = settleSend(&written_total); rc != 0) {
            return rc;
        }
    }
    while (!stalled && !out_.empty() && written_total < budget) {
        if (poolSend() != PoolSend::kNo) {
            waiting_tag_ = true;  // the pool wakes us when the tag is there or the send ended
            break;
        }
        iovec iov[kMaxIovPerWrite];
        size_t n = 0;
        bool at_tag = false;  // stopped before a tag the pool has not finished
        for (auto it = out_.begin(); it != out_.end() && n + 3 <= kMaxIovPerWrite; ++it) {
            if (it != out_.begin() && poolable(*it)) {
                break;  // a worker sends it once it is the head
            }
            const uint8_t *head = it->big.empty() ? it->head.data() : it->big.data();
            const size_t head_len = it->big.empty() ? it->head_len : it->big.size();
            size_t skip = it->sent;
            if (skip < head_len) {
                iov[n++] = {const_cast<uint8_t *>(head + skip), head_len - skip};
                skip = 0;
            } else {
                skip -= head_len;
            }
            if (it->data_len > skip) {
                if (it->data_waits && it->job && !it->job->done.load(std::memory_order_acquire)) {
                    at_tag = true;  // a worker still gathers its data
                    break;
                }
                iov[n++] = {const_cast<uint8_t *>(it->data + skip), it->data_len - skip};
                skip = 0;
            } else {
                skip -= it->data_len;
            }
            if (it->tag_len > skip) {
                if (it->job) {
                    if (!it->job->done.load(std::memory_order_acquire)) {
                        at_tag = true;
                        break;
                    }
                    it->tag = it->job->tag;
                    it->job.reset();
                }
                iov[n++] = {it->tag.data() + skip, it->tag_len - skip};
            }
        }
        if (n == 0) {
            waiting_tag_ = at_tag;  // all before the tag has gone; the pool wakes us
            break;
        }
        // sendmsg rather than writev for MSG_NOSIGNAL: a peer that reset the connection must
        // give EPIPE here, not a SIGPIPE that kills the sidecar.
        msghdr msg{};
        msg.msg_iov = iov;
        msg.msg_iovlen = n;
        ssize_t w = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) {
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                break;
            }
            return errno;
        }
        size_t left = static_cast<size_t>(w);
        written_total += left;
        bytes_out += left;
        out_bytes_ -= left;
        while (left > 0) {
            OutItem &front = out_.front();
            const size_t rest = front.size() - front.sent;
            if (left >= rest) {
                left -= rest;
                if (front.tag_id != 0) {
                    sent_.push_back(front.tag_id);
                }
                out_.pop_front();
            } else {
                front.sent += left;
                left = 0;
            }
        }
    }
    if (written_total > 0) {
        last_tx_ms = now_ms;
        last_out_progress_ms = now_ms;
    }
    setWantWrite(!out_.empty() && !waiting_tag_);
    return 0;
}

void Connection::consume(size_t n) {
    rpos_ += n;
    if (rpos_ == wpos_) {
        rpos_ = wpos_ = 0;
    }
}

int Connection::fill(int64_t now_ms, size_t at_most) {
    if (!fd_) {
        return EBADF;
    }
    if (rpos_ > 0 && wpos_ == in_.size()) {
        std::copy(in_.begin() + static_cast<ptrdiff_t>(rpos_),
                  in_.begin() + static_cast<ptrdiff_t>(wpos_), in_.begin());
        wpos_ -= rpos_;
        rpos_ = 0;
    }
    if (wpos_ == in_.size()) {
        return ENOBUFS;
    }
    for (;;) {
        const size_t ask = std::min(in_.size() - wpos_, at_most);
        ssize_t r = ::recv(fd_.get(), in_.data() + wpos_, ask, 0);
        drained_ = r < static_cast<ssize_t>(ask);
        if (r > 0) {
            wpos_ += static_cast<size_t>(r);
            bytes_in += static_cast<uint64_t>(r);
            last_rx_ms = now_ms;
            return 0;
        }
        if (r == 0) {
            return ECONNRESET;
        }
        if (errno == EINTR) {
            continue;
        }
        return errno == EWOULDBLOCK ? EAGAIN : errno;
    }
}

int Connection::fillAtLeast(size_t want, int64_t now_ms, size_t at_most) {
    if (buffered() >= want) {
        return 0;
    }
    if (in_.size() - rpos_ < want) {
        std::copy(in_.begin() + static_cast<ptrdiff_t>(rpos_),
                  in_.begin() + static_cast<ptrdiff_t>(wpos_), in_.begin());
        wpos_ -= rpos_;
        rpos_ = 0;
    }
    return fill(now_ms, at_most == SIZE_MAX ? SIZE_MAX : std::max(want, at_most) - buffered());
}

Connection::Parse Connection::nextFrame(uint32_t max_payload, FrameHeader *header,
                                        std::span<const uint8_t> *payload, std::string *error) {
    if (buffered() < kFrameHeaderBytes) {
        return Parse::kNeedMore;
    }
    FrameHeader h;
    if (!decodeFrameHeader(bufferedData(), &h)) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "bad frame magic 0x%04x", loadLe16(bufferedData()));
        *error = buf;
        return Parse::kBad;
    }
    if (h.length > max_payload) {
        *error = frameTypeName(static_cast<uint8_t>(h.type)) + " frame of " +
                 std::to_string(h.length) + " bytes exceeds the limit of " +
                 std::to_string(max_payload);
        return Parse::kBad;
    }
    const size_t tag = rx_auth_.enabled() ? kFrameTagBytes : 0;
    const size_t whole = kFrameHeaderBytes + h.length + tag;
    if (buffered() < whole) {
        // Make sure the whole frame can fit; it always can since max_payload is far below the
        // buffer size.
        if (in_.size() - rpos_ < whole) {
            std::copy(in_.begin() + static_cast<ptrdiff_t>(rpos_),
                      in_.begin() + static_cast<ptrdiff_t>(wpos_), in_.begin());
            wpos_ -= rpos_;
            rpos_ = 0;
        }
        return Parse::kNeedMore;
    }
    if (tag != 0) {
        rx_auth_.begin(kFrameHeaderBytes + h.length);
        rx_auth_.update(bufferedData(), kFrameHeaderBytes + h.length);
        if (!rx_auth_.verify(bufferedData() + kFrameHeaderBytes + h.length)) {
            *error = frameTypeName(static_cast<uint8_t>(h.type)) +
                     " frame fails its authentication tag (injected, replayed or corrupted)";
            return Parse::kBad;
        }
    }
    *header = h;
    *payload = std::span<const uint8_t>(bufferedData() + kFrameHeaderBytes, h.length);
    frame_bytes_ = whole;
    return Parse::kFrame;
}

int Connection::readInto(uint8_t *dest, size_t len, size_t *got, int64_t now_ms) {
    size_t done = 0;
    if (buffered() > 0) {
        done = std::min(buffered(), len);
        std::copy(bufferedData(), bufferedData() + done, dest);
        consume(done);
        if (done == len) {
            *got = done;
            return 0;
        }
    }
    // The buffer is empty now (consume() rewound it), so all of it can take the overflow.
    iovec iov[2] = {{dest + done, len - done}, {in_.data(), in_.size()}};
    for (;;) {
        ssize_t r = ::readv(fd_.get(), iov, 2);
        drained_ = r < static_cast<ssize_t>(len - done + in_.size());
        if (r > 0) {
            const size_t n = static_cast<size_t>(r);
            bytes_in += n;
            last_rx_ms = now_ms;
            if (n <= len - done) {
                done += n;
            } else {
                wpos_ = n - (len - done);
                rpos_ = 0;
                done = len;
            }
            *got = done;
            return 0;
        }
        if (r == 0) {
            *got = done;
            return done > 0 ? 0 : ECONNRESET;
        }
        if (errno == EINTR) {
            continue;
        }
        *got = done;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            return done > 0 ? 0 : EAGAIN;
        }
        return errno;
    }
}

}  // namespace tensorlane::sidecar
