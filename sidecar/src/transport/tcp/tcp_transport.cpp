#include "transport/tcp/tcp_transport.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <utility>

#include "net/cpus.hpp"
#include "net/env_knob.hpp"
#include "net/frame_reader.hpp"
#include "net/socket.hpp"

namespace tensorlane::sidecar {

namespace {

/// Poller tokens of the staging pools' eventfds (below the connections' tokens).
constexpr uint64_t kSendStagingToken = 1;
constexpr uint64_t kRecvStagingToken = 2;
constexpr uint64_t kTagToken = 3;
/// A traced progress() this long or longer is written down (TENSORLANE_TRACE_FILE).
constexpr uint32_t kTraceProgressUs = 15;

std::atomic<size_t> g_test_read_budget{0};

size_t readBudget() {
    const size_t test = g_test_read_budget.load();
    return test != 0 ? test : TcpTransport::kDefaultReadBudget;
}

/// TENSORLANE_TAG_SPIN_US (0-1000, default 0): how long an idle tag worker spins before it
/// sleeps. An experiment's knob (docs/peers.md), not a setting of the TOML.
unsigned tagSpinUs() {
    return static_cast<unsigned>(
        std::min<uint64_t>(envNumber("TENSORLANE_TAG_SPIN_US").value_or(0), 1000));
}

/// TENSORLANE_TCP_ACK_DELAY_US (0-1000, default 0): how long a receiving sidecar holds its ACKs
/// after the notifications are out before it sends them (an experiment's knob, docs/peers.md):
/// the client's next request is then posted before the ACKs' send.
std::chrono::microseconds ackDelay() {
    return std::chrono::microseconds(
        std::min<uint64_t>(envNumber("TENSORLANE_TCP_ACK_DELAY_US").value_or(0), 1000));
}

/// TENSORLANE_TAG_SOCKET_IO=0 keeps every socket copy on the engine thread, the tag workers
/// only computing tags: an experiment's knob (docs/peers.md), not a setting of the TOML.
bool tagSocketIo() {
    const char *v = std::getenv("TENSORLANE_TAG_SOCKET_IO");
    return v == nullptr || std::strcmp(v, "0") != 0;
}

unsigned tagThreadsFor(const config::Config &cfg) {
    if (cfg.security.tcp_integrity == config::TcpIntegrity::kNone) {
        return 0;
    }
    return cfg.tcp.tag_threads ? *cfg.tcp.tag_threads : TagPool::autoThreads(usableCpus().cpus);
}

/// The tcp transport's bootstrap blob (SELECT / SELECTED): kTcpBlobVersion, connections, chunk
/// bytes.
constexpr size_t kTcpBlobBytes = 2 + 4 + 4;

struct TcpParams {
    uint32_t connections = 0;
    uint32_t chunk_bytes = 0;
};

/// Decodes the other end's blob and checks it against ours.
Status checkTcpBlob(const std::vector<uint8_t> &blob, const TcpParams &ours,
                    const std::string &peer_name) {
    if (blob.size() < 2) {
        return {Code::kInvalid, "peer '" + peer_name + "' sent no tcp session parameters"};
    }
    const uint16_t version = static_cast<uint16_t>(blob[0] | blob[1] << 8);
    if (version != kTcpBlobVersion || blob.size() != kTcpBlobBytes) {
        return {Code::kInvalid, "tcp transport version mismatch: this node speaks version " +
                                    std::to_string(kTcpBlobVersion) + ", peer '" + peer_name +
                                    "' speaks version " + std::to_string(version) +
                                    "; run the same tensorlane release on both nodes"};
    }
    const TcpParams theirs{loadLe32(blob.data() + 2), loadLe32(blob.data() + 6)};
    auto differs = [&](const char *key, uint32_t a, uint32_t b) {
        return Status{Code::kInvalid, std::string("[tcp] ") + key + " differs: this node has " +
                                          std::to_string(a) + ", peer '" + peer_name + "' has " +
                                          std::to_string(b) +
                                          "; both ends must set the same value"};
    };
    if (theirs.chunk_bytes != ours.chunk_bytes) {
        return differs("chunk_bytes", ours.chunk_bytes, theirs.chunk_bytes);
    }
    if (theirs.connections != ours.connections) {
        return differs("connections_per_peer", ours.connections, theirs.connections);
    }
    return Status::ok();
}

}  // namespace

std::vector<uint8_t> encodeTcpBlob(uint32_t connections, uint32_t chunk_bytes) {
    std::vector<uint8_t> b(kTcpBlobBytes);
    b[0] = kTcpBlobVersion & 0xff;
    b[1] = kTcpBlobVersion >> 8;
    storeLe32(b.data() + 2, connections);
    storeLe32(b.data() + 6, chunk_bytes);
    return b;
}

TcpTransport::TcpTransport(const config::Config &cfg, RegionTable &regions)
    : cfg_(cfg),
      regions_(regions),
      busy_(cfg.ipc.poll_mode == config::PollMode::kBusy),
      tags_(std::make_unique<TagPool>(tagThreadsFor(cfg), tagSpinUs(), tagSocketIo())),
      send_staging_(cfg.tcp.chunk_bytes, kStagingSlots),
      recv_staging_(cfg.tcp.chunk_bytes, kStagingSlots),
      host_staging_(cfg.tcp.chunk_bytes, kHostChecksPerTagThread * tags_->threads()),
      read_budget_(readBudget()),
      ack_delay_(ackDelay()) {}

void TcpTransport::setReadBudgetForTests(size_t bytes) {
    g_test_read_budget.store(bytes);
}

TcpTransport::~TcpTransport() {
    // Connections deregister from the poller when destroyed: before the poller goes.
    peers_.clear();
    dead_.clear();
}

int TcpTransport::init() {
    if (int rc = poller_.open(); rc != 0) {
        return rc;
    }
    if (tags_->wakeFd() >= 0) {
        return poller_.add(tags_->wakeFd(), EPOLLIN, kTagToken);
    }
    return 0;
}

TransportCaps TcpTransport::caps() const {
    TransportCaps c;
    c.host_memory = true;
    c.cuda_memory = true;  // staged through host memory (staging.hpp)
    c.remote = true;
    c.ordered = true;
    c.scatter = true;           // silent writes (kChunkScatter, small extents kChunkPacked)
    c.scatter_from_gpu = true;  // staged like any GPU source
    c.wire_id = kTransportTcp;
    return c;
}

std::vector<uint8_t> TcpTransport::localBlob(PeerId, SessionSide) {
    return encodeTcpBlob(cfg_.tcp.connections_per_peer, cfg_.tcp.chunk_bytes);
}

Status TcpTransport::post(const WriteOp &op) {
    auto it = peers_.find(op.peer);
    if (it == peers_.end() || !it->second.out || !it->second.out->link) {
        return {Code::kPeer, "no tcp session to peer " + std::to_string(op.peer) + " is up"};
    }
    if (Status st = checkMessage(op); !st.isOk()) {
        return st;
    }
    if (op.bytes != 0 && op.src && op.src->dmabufOnly()) {
        return {Code::kCuda, std::string("tcp: ") + kDmabufOnlyReason};
    }
    const bool readable =
        op.src && (op.src->kind == MemoryKind::kCuda ? op.src->cuda.import != nullptr
                                                     : op.src->base != nullptr);
    if (op.extents) {
        for (const Extent &e : *op.extents) {
            if (!readable || !op.silent || e.bytes == 0 ||
                !op.src->contains(e.src_offset, e.bytes)) {
                return {Code::kInvalid,
                        "a scattered write is silent, from readable memory, and "
                        "every extent inside its source"};
            }
        }
    } else if (op.bytes != 0 && (!readable || !op.src->contains(op.src_offset, op.bytes))) {
        return {Code::kInvalid, "the source range is not readable memory of the source region"};
    }
    Status st = it->second.out->link->post(op, monotonicMs(), !op.more);
    if (st.isOk() && op.more) {
        held_.push_back(op.peer);
    }
    if (op.bytes != 0 && op.src->kind == MemoryKind::kCuda) {
        send_staging_.flush();
        watchStaging(send_staging_, kSendStagingToken, &send_watched_);
    }
    return st;
}

Status TcpTransport::openSession(PeerId id, SessionSide side, const SessionInfo &info,
                                 uint32_t *channels) {
    const TcpParams ours{cfg_.tcp.connections_per_peer, cfg_.tcp.chunk_bytes};
    *channels = 0;
    if (Status s = checkTcpBlob(info.remote_blob, ours, info.peer_name); !s.isOk()) {
        return s;
    }
    PeerData &p = peer(id);
    if (side == SessionSide::kOut) {
        p.out = std::make_unique<OutSide>();
        p.out->info = info;
        p.out->data.resize(ours.connections);
        link_->openChannels(id, ours.connections);
    } else {
        p.in = std::make_unique<InSide>();
        p.in->info = info;
        p.in->data.resize(ours.connections);
        p.in->link =
            std::make_unique<InLink>(regions_, info.peer_name, ours.chunk_bytes, kMaxWindow,
                                     recv_staging_, host_staging_, tags_.get());
        *channels = ours.connections;
    }
    return Status::ok();
}

void TcpTransport::closeSession(PeerId id, SessionSide side, Code code, const std::string &reason) {
    auto it = peers_.find(id);
    if (it == peers_.end()) {
        return;
    }
    PeerData &p = it->second;
    if (side == SessionSide::kOut && p.out) {
        // Close the connections first: their queued output points into the writes' source
        // regions, which failing the writes lets go.
        for (auto &c : p.out->data) {
            if (c) {
                c->dropOutput();
                c->close();
                dead_.push_back(std::move(c));
            }
        }
        if (p.out->link) {
            p.out->link->failAll(code, reason, &completions_);
            dead_links_.push_back(std::move(p.out->link));
        }
        p.out.reset();
    } else if (side == SessionSide::kIn && p.in) {
        // Workers reading chunks stop first: they read these sockets.
        if (p.in->link) {
            p.in->link->stopReads();
        }
        // Writes half received are dropped: the writer fails them when it sees the session die.
        for (auto &c : p.in->data) {
            if (c) {
                c->close();
                dead_.push_back(std::move(c));
            }
        }
        dead_in_links_.push_back(std::move(p.in->link));
        p.in.reset();
    }
}

void TcpTransport::adoptChannel(PeerId id, SessionSide side, uint32_t index,
                                std::unique_ptr<Connection> conn) {
    PeerData &p = peer(id);
    std::vector<std::unique_ptr<Connection>> *slots = nullptr;
    if (side == SessionSide::kOut && p.out) {
        slots = &p.out->data;
    } else if (side == SessionSide::kIn && p.in) {
        slots = &p.in->data;
    }
    if (slots == nullptr || index >= slots->size() || (*slots)[index]) {
        conn->close();
        dead_.push_back(std::move(conn));
        return;
    }
    if (side == SessionSide::kOut && conn->buffered() != 0) {
        // The target speaks on a data connection only to acknowledge writes, and none went yet.
        conn->close();
        dead_.push_back(std::move(conn));
        link_->failSession(id, side, "protocol error: bytes after READY on a data connection");
        return;
    }
    conn->rebind(poller_);
    conn->setTagPool(tags_.get());
    conn->peer = id;
    conn->index = index;
    conn->role = side == SessionSide::kOut ? ConnRole::kOutData : ConnRole::kInData;
    (*slots)[index] = std::move(conn);
    if (side != SessionSide::kOut) {
        return;
    }
    for (const auto &c : p.out->data) {
        if (!c) {
            return;
        }
    }
    std::vector<Connection *> conns;
    for (auto &c : p.out->data) {
        conns.push_back(c.get());
    }
    p.out->link =
        std::make_unique<OutLink>(std::move(conns), cfg_.tcp.chunk_bytes,
                                  std::min<size_t>(cfg_.tcp.window, kMaxWindow), send_staging_);
    p.out->link->setPeerName(p.out->info.peer_name);
    link_->sessionReady(id);
}

bool TcpTransport::onAck(PeerId id, uint64_t seq, std::span<const uint8_t> payload,
                         std::string *error) {
    auto it = peers_.find(id);
    if (payload.size() != kAckPayloadBytes || it == peers_.end() || !it->second.out ||
        !it->second.out->link) {
        *error = "malformed ACK";
        return false;
    }
    PeerData &p = it->second;
    const Code code = ipc::sanitizeCode(static_cast<int32_t>(loadLe32(payload.data())));
    const bool changed = (loadLe32(payload.data() + 4) & kAckDataChanged) != 0;
    const size_t before = completions_.size();
    if (!p.out->link->onAck(seq, code, changed, &completions_, error)) {
        return false;
    }
    if (code == Code::kOk && completions_.size() > before) {
        ++p.writes_sent;
        p.bytes_sent += completions_.back().bytes;
    }
    return true;
}

void TcpTransport::fail(PeerId id, SessionSide side, const std::string &reason) {
    // The peer layer tears the whole session down, which calls closeSession() back.
    link_->failSession(id, side, reason);
}

void TcpTransport::onEvent(Connection &c, uint32_t events, int64_t now) {
    const PeerId id = c.peer;
    auto it = peers_.find(id);
    if (it == peers_.end()) {
        return;
    }
    PeerData &p = it->second;
    if (c.role == ConnRole::kOutData) {
        if (!p.out || c.index >= p.out->data.size() || p.out->data[c.index].get() != &c) {
            return;
        }
        if ((events & EPOLLOUT) != 0) {
            if (int rc = c.flush(now); rc != 0) {
                fail(id, SessionSide::kOut, "data connection: " + errnoText(rc));
                return;
            }
            if (p.out->link) {
                p.out->link->noteSent(c);
                if (int rc = p.out->link->pump(now); rc != 0) {
                    fail(id, SessionSide::kOut, "data connection: " + errnoText(rc));
                    return;
                }
            }
        }
        if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0) {
            readAcks(id, c, now);
        }
        return;
    }
    if (!p.in || c.index >= p.in->data.size() || p.in->data[c.index].get() != &c) {
        return;
    }
    if ((events & EPOLLOUT) != 0) {
        // READY, if the handshake's last frame did not leave at once.
        if (int rc = c.flush(now); rc != 0) {
            fail(id, SessionSide::kIn, "data connection: " + errnoText(rc));
            return;
        }
    }
    if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) == 0) {
        return;
    }
    readIn(p, id, c, now);
}

void TcpTransport::readAcks(PeerId id, Connection &c, int64_t now) {
    // The target answers on data connection 0, in sequence order: one ACK frame per write.
    // Nothing else ever comes back on a data connection.
    const FramesRead r = readFrames(
        c, now, kAckPayloadBytes, [&](const FrameHeader &h, std::span<const uint8_t> payload) {
            if (c.index != 0 || h.type != FrameType::kAck) {
                fail(id, SessionSide::kOut,
                     "protocol error on a data connection: unexpected " +
                         frameTypeName(static_cast<uint8_t>(h.type)));
                return FrameStep::kStop;
            }
            uint8_t ack[kAckPayloadBytes] = {};
            const size_t len = std::min(payload.size(), sizeof ack);
            std::memcpy(ack, payload.data(), len);
            const uint64_t seq = h.arg;
            c.consumeFrame(h);
            std::string error;
            if (!onAck(id, seq, std::span<const uint8_t>(ack, len), &error)) {
                fail(id, SessionSide::kOut, "protocol error: " + error);
                return FrameStep::kStop;  // the session (and this connection's place in it) is gone
            }
            return FrameStep::kNext;
        });
    if (r.end == FramesRead::End::kBad) {
        fail(id, SessionSide::kOut, "protocol error on a data connection: " + r.error);
    } else if (r.end == FramesRead::End::kClosed) {
        fail(id, SessionSide::kOut, "data connection closed by the peer");
    } else if (r.end == FramesRead::End::kFailed) {
        fail(id, SessionSide::kOut, "data connection: " + errnoText(r.rc));
    }
}

void TcpTransport::readIn(PeerData &p, PeerId id, Connection &c, int64_t now) {
    std::string error;
    int rc = p.in->link->onReadable(c, read_budget_, now, &error);
    if (rc == EINPROGRESS) {
        const std::pair<PeerId, uint32_t> key{id, c.index};
        if (std::find(resume_.begin(), resume_.end(), key) == resume_.end()) {
            resume_.push_back(key);
        }
        rc = 0;
    }
    if (p.in->link->blocked()) {
        // Waits for a receive slot: its pool's eventfd brings us back (dispatchStaging).
        watchStaging(recv_staging_, kRecvStagingToken, &recv_watched_);
    }
    if (rc == EPROTO) {
        fail(id, SessionSide::kIn, "protocol error on a data connection: " + error);
    } else if (rc == ECONNRESET) {
        fail(id, SessionSide::kIn, "data connection closed by the peer");
    } else if (rc != 0) {
        fail(id, SessionSide::kIn, "data connection: " + errnoText(rc));
    }
}

void TcpTransport::collectTags(int64_t now) {
    tags_->clearWake();
    std::vector<std::pair<PeerId, std::string>> in_failed;
    std::vector<std::pair<PeerId, std::string>> out_failed;
    for (auto &[id, p] : peers_) {
        if (p.in && p.in->link && p.in->link->verifying() > 0) {
            std::string error;
            std::vector<Connection *> resume;
            const int rc = p.in->link->collectTags(now, &error, &resume);
            if (rc == EPROTO) {
                in_failed.emplace_back(id, "protocol error on a data connection: " + error);
            } else if (rc != 0) {
                in_failed.emplace_back(id, error);
            }
            for (const Connection *c : resume) {
                // Its worker gave the socket back: read on (epoll may not report bytes that
                // came while it was not polled for input).
                const std::pair<PeerId, uint32_t> key{id, c->index};
                if (std::find(resume_.begin(), resume_.end(), key) == resume_.end()) {
                    resume_.push_back(key);
                }
            }
        }
        if (p.out && p.out->link) {
            bool waiting = false;
            for (const auto &c : p.out->data) {
                waiting = waiting || (c && c->waitingForTag());
            }
            if (waiting) {
                if (int rc = p.out->link->pump(now); rc != 0) {
                    out_failed.emplace_back(id, "data connection: " + errnoText(rc));
                }
            }
        }
    }
    for (auto &[id, why] : in_failed) {
        fail(id, SessionSide::kIn, why);
    }
    for (auto &[id, why] : out_failed) {
        fail(id, SessionSide::kOut, why);
    }
}

void TcpTransport::regionRevoked(PeerId id, RegionId r) {
    auto it = peers_.find(id);
    if (it == peers_.end() || !it->second.in || !it->second.in->link) {
        return;
    }
    std::vector<Connection *> conns;
    for (auto &c : it->second.in->data) {
        conns.push_back(c.get());
    }
    it->second.in->link->quiesceRegion(r, conns);
}

void TcpTransport::watchStaging(TcpStaging &staging, uint64_t token, bool *watched) {
    if (!*watched && staging.wakeFd() >= 0) {
        *watched = poller_.add(staging.wakeFd(), EPOLLIN, token) == 0;
    }
}

void TcpTransport::sendHeld(int64_t now) {
    if (held_.empty()) {
        return;
    }
    // Each looked up afresh: a failure below may end a session held again further on.
    for (PeerId id : std::exchange(held_, {})) {
        auto it = peers_.find(id);
        if (it == peers_.end() || !it->second.out || !it->second.out->link) {
            continue;  // the session went meanwhile: its writes were failed with it
        }
        if (int rc = it->second.out->link->pump(now); rc != 0) {
            fail(id, SessionSide::kOut, "data connection: " + errnoText(rc));
        }
    }
}

size_t TcpTransport::dispatchStaging(int64_t now) {
    // A pool starts on first use (a GPU write posted, a chunk for a GPU region): from then on
    // its eventfd wakes the engine when copies end.
    watchStaging(send_staging_, kSendStagingToken, &send_watched_);
    watchStaging(recv_staging_, kRecvStagingToken, &recv_watched_);
    size_t n = send_staging_.dispatch() + recv_staging_.dispatch();
    if (n == 0) {
        return 0;
    }
    std::vector<std::pair<PeerId, std::string>> failed_reasons;
    for (auto &[id, p] : peers_) {
        if (p.out && p.out->link) {
            OutLink &link = *p.out->link;
            if (!link.stagingError().empty()) {
                failed_reasons.emplace_back(id, link.stagingError());
                continue;
            }
            if (link.wantsPump()) {
                if (int rc = link.pump(now); rc != 0) {
                    failed_reasons.emplace_back(id, "data connection: " + errnoText(rc));
                }
            }
        }
    }
    for (auto &[id, why] : failed_reasons) {
        fail(id, SessionSide::kOut, why);
    }
    // Chunks that waited for a receive slot: their headers may sit in our buffer with the
    // socket already drained, so epoll would never bring them back.
    std::vector<PeerId> blocked;
    for (auto &[id, p] : peers_) {
        if (p.in && p.in->link && p.in->link->blocked()) {
            blocked.push_back(id);
        }
    }
    for (PeerId id : blocked) {
        auto it = peers_.find(id);
        if (it == peers_.end() || !it->second.in || !it->second.in->link) {
            continue;
        }
        PeerData &p = it->second;
        p.in->link->clearBlocked();
        for (size_t i = 0; p.in && i < p.in->data.size(); ++i) {
            if (Connection *c = p.in->data[i].get(); c != nullptr && c->isOpen()) {
                readIn(p, id, *c, now);
            }
        }
    }
    return n;
}

size_t TcpTransport::deliver(EventSink &sink) {
    size_t n = 0;
    for (auto &[id, p] : peers_) {
        if (!p.in || !p.in->link || !p.in->link->deliverable()) {
            continue;
        }
        InLink &link = *p.in->link;
        const uint64_t writes_before = link.writesReceived();
        const uint64_t bytes_before = link.bytesReceived();
        const PeerId peer_id = id;
        // ACKs go back on data connection 0, all of this turn's in one send.
        Connection *acks = p.in->data.empty() ? nullptr : p.in->data[0].get();
        bool failed = false;
        n += link.deliver(sink, [&](uint64_t seq, Code code, bool changed) {
            if (failed || acks == nullptr || !acks->isOpen()) {
                failed = true;
                return;
            }
            uint8_t payload[kAckPayloadBytes];
            storeLe32(payload, static_cast<uint32_t>(code));
            storeLe32(payload + 4, changed ? kAckDataChanged : 0);
            acks->queueFrame(FrameType::kAck, seq, payload);
        });
        p.writes_received += link.writesReceived() - writes_before;
        p.bytes_received += link.bytesReceived() - bytes_before;
        if (failed) {
            fail(peer_id, SessionSide::kIn,
                 "cannot send acknowledgements: data connection 0 is not open");
        } else if (acks != nullptr && acks->hasOutput()) {
            if (acks_due_.empty() && ack_delay_.count() != 0) {
                acks_due_since_ = std::chrono::steady_clock::now();
            }
            if (std::find(acks_due_.begin(), acks_due_.end(), peer_id) == acks_due_.end()) {
                acks_due_.push_back(peer_id);  // sent once the notifications are out
            }
        }
    }
    return n;
}

void TcpTransport::afterPublish() {
    if (acks_due_.empty()) {
        return;
    }
    if (ack_delay_.count() != 0 &&
        std::chrono::steady_clock::now() - acks_due_since_ < ack_delay_) {
        return;  // the engine does not sleep meanwhile (arm())
    }
    const int64_t now = monotonicMs();
    for (PeerId id : std::exchange(acks_due_, {})) {
        auto it = peers_.find(id);
        if (it == peers_.end() || !it->second.in || it->second.in->data.empty()) {
            continue;  // the session went in the meantime
        }
        Connection *acks = it->second.in->data[0].get();
        if (acks == nullptr || !acks->isOpen() || !acks->hasOutput()) {
            continue;
        }
        if (int rc = acks->flush(now); rc != 0) {
            fail(id, SessionSide::kIn, "cannot send acknowledgements: " + errnoText(rc));
        }
    }
    reapDead();  // (a failed session's connections)
}

void TcpTransport::reapDead() {
    dead_.clear();
    dead_links_.clear();
    dead_in_links_.clear();
}

void TcpTransport::checkStalls(int64_t now) {
    const int64_t timeout = cfg_.tcp.peer_timeout_ms;
    std::vector<PeerId> stalled;
    for (auto &[id, p] : peers_) {
        if (!p.out) {
            continue;
        }
        for (const auto &c : p.out->data) {
            if (c && c->hasOutput() && now - c->last_out_progress_ms >= timeout) {
                stalled.push_back(id);
                break;
            }
        }
    }
    for (PeerId id : stalled) {
        fail(id, SessionSide::kOut,
             "sending stalled for " + std::to_string(timeout) + " ms (the peer stopped reading)");
    }
}

void TcpTransport::resumeReads(int64_t now) {
    if (resume_.empty()) {
        return;
    }
    // The list is taken first: a connection that uses its budget again is put back for the
    // next turn, after the others (and epoll's) have had theirs.
    for (const auto &[id, index] : std::exchange(resume_, {})) {
        auto it = peers_.find(id);
        if (it == peers_.end() || !it->second.in || !it->second.in->link ||
            index >= it->second.in->data.size()) {
            continue;  // the session went meanwhile
        }
        PeerData &p = it->second;
        if (Connection *c = p.in->data[index].get(); c != nullptr && c->isOpen()) {
            readIn(p, id, *c, now);
        }
    }
}

size_t TcpTransport::progress(EventSink &sink) {
    const int64_t now = monotonicMs();
    TurnTimer turn("tcp", kTraceProgressUs);  // traced: where a long progress went
    sendHeld(now);
    turn.mark("held");
    epoll_event evs[64];
    // Only data connections live in this set: with none (every peer on another transport)
    // there is nothing to ask. The sleeping modes ask only when the engine saw the set
    // readable (readable()); busy mode asks every turn, as the engine looks at fds rarely.
    int n = 0;
    if (!poller_.noConnections() && (io_ready_ || busy_)) {
        io_ready_ = false;
        n = poller_.wait(evs, 64, 0);
        io_ready_ = n == 64;  // more may wait
    }
    bool tags_ended = false;
    for (int i = 0; i < n; ++i) {
        if (evs[i].data.u64 == kTagToken) {
            tags_ended = true;
        } else if (Connection *c = poller_.find(evs[i].data.u64)) {
            onEvent(*c, evs[i].events, now);
        }
    }
    turn.mark("events");
    if (tags_ended) {
        collectTags(now);
    }
    turn.mark("tags");
    resumeReads(now);
    turn.mark("resume");
    dispatchStaging(now);
    // Copies queued during this turn (chunks cut or landed) go to the stagers together.
    send_staging_.flush();
    recv_staging_.flush();
    turn.mark("staging");
    size_t events = deliver(sink);
    turn.mark("deliver");
    if (now - last_stall_check_ms_ >= 100) {
        last_stall_check_ms_ = now;
        checkStalls(now);
    }
    auto done = std::exchange(completions_, {});
    for (const Completion &c : done) {
        sink.completed(c.op_id, c.code, c.reason);
    }
    events += done.size();
    reapDead();
    turn.mark("done");
    return events;
}

TransportPeerReport TcpTransport::peerReport(PeerId id, ReportDetail want) const {
    TransportPeerReport r;
    r.transport = "tcp";
    auto j = std::make_shared<nlohmann::json>(nlohmann::json::object());
    (*j)["transport"] = "tcp";
    if (want == ReportDetail::kFull) {
        r.detail = j;
    }
    auto it = peers_.find(id);
    if (it == peers_.end()) {
        return r;
    }
    const PeerData &p = it->second;
    nlohmann::json out_bytes = nlohmann::json::array();
    uint64_t queued = 0;
    size_t conns = 0;
    if (p.out) {
        for (const auto &c : p.out->data) {
            conns += c && c->isOpen() ? 1 : 0;
            out_bytes.push_back(c ? c->bytes_out : 0);
            queued += c ? c->queuedBytes() : 0;
        }
    }
    if (p.in) {
        for (const auto &c : p.in->data) {
            conns += c && c->isOpen() ? 1 : 0;
        }
    }
    r.data_connections = conns;
    r.in_flight = p.out && p.out->link ? p.out->link->inFlight() : 0;
    if (want == ReportDetail::kTyped) {
        return r;
    }
    (*j)["data_connections"] = r.data_connections;
    (*j)["in_flight"] = r.in_flight;
    (*j)["writes_sent"] = p.writes_sent;
    (*j)["bytes_sent"] = p.bytes_sent;
    (*j)["writes_received"] = p.writes_received;
    (*j)["bytes_received"] = p.bytes_received;
    (*j)["data_bytes_sent"] = std::move(out_bytes);
    (*j)["queued_bytes"] = queued;  // cut into chunks, not yet taken by the sockets
    (*j)["uncut_bytes"] = p.out && p.out->link ? p.out->link->uncutBytes() : 0;
    (*j)["integrity"] = p.out ? p.out->info.integrity : (p.in ? p.in->info.integrity : false);
    // Chunks from this peer's session whose data failed its tag while their headers held: their
    // writes failed, the session went on.
    (*j)["chunks_data_changed"] = p.in && p.in->link ? p.in->link->chunksChanged() : 0;
    // Shared by every peer of this transport.
    (*j)["tag_threads"] = tags_->threads();
    (*j)["tags_offloaded"] = tags_->jobsDone();
    (*j)["chunks_read_by_tag_workers"] = tags_->readsDone();
    (*j)["chunks_sent_by_tag_workers"] = tags_->sendsDone();
    (*j)["bytes_sent_by_tag_workers"] = tags_->bytesSent();
    return r;
}

}  // namespace tensorlane::sidecar
