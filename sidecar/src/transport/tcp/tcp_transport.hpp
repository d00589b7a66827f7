// Transport "tcp": write-with-immediate over the data connections of authenticated peer
// sessions (docs/peers.md, "Data path"). The peer layer authenticates the connections and
// hands them over; this transport owns them from then on, polls them in its own epoll set, and
// reports through the engine's EventSink.
//
// The sending side of a session (kOut) is an OutLink over connections_per_peer connections;
// the receiving side (kIn) an InLink whose ACKs travel back on data connection 0 (the session's
// control connection, the peer layer's, carries none of this transport's traffic).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tensorlane/config/config.hpp"
#include "transport/set.hpp"
#include "transport/tcp/links.hpp"
#include "transport/tcp/staging.hpp"

namespace tensorlane::sidecar {

/// The version at the front of the tcp transport's bootstrap blob. 2: ChunkHeader::flags (silent
/// writes and messages); 3: packed chunks (kChunkPacked); 4: a chunk's trailer holds a header
/// tag after its tag (kChunkTrailerBytes), and an ACK's second word says why a write failed. A
/// peer of another version is refused at SELECT, naming both.
inline constexpr uint16_t kTcpBlobVersion = 4;

/// The tcp transport's bootstrap blob (SELECT / SELECTED): its version, then the sender's
/// [tcp] connections_per_peer and chunk_bytes, which both ends must share.
std::vector<uint8_t> encodeTcpBlob(uint32_t connections, uint32_t chunk_bytes);

class TcpTransport final : public Transport {
public:
    /// Writes in flight per peer session, at most (the receiver's reorder window).
    static constexpr size_t kMaxWindow = 4096;
    /// Staging slots (one chunk each) for GPU regions, per direction.
    static constexpr uint32_t kStagingSlots = 16;
    /// Host chunks checked by the tag workers at once, per worker (each holds a receive buffer
    /// of one chunk until its tag is checked and the chunk copied into its region).
    static constexpr size_t kHostChecksPerTagThread = 16;

    TcpTransport(const config::Config &cfg, RegionTable &regions);
    ~TcpTransport() override;
    TcpTransport(const TcpTransport &) = delete;
    TcpTransport &operator=(const TcpTransport &) = delete;

    /// Creates the epoll set. Returns 0 or errno.
    int init();

    // Transport
    const char *name() const override { return "tcp"; }
    TransportCaps caps() const override;
    /// Nothing to register: the target writes into the region's mapped memory.
    Status registerRegion(Region &) override { return Status::ok(); }
    void deregisterRegion(RegionId) override {}
    /// kPeer at once while the session is not up; kAgain when its window is full.
    Status post(const WriteOp &op) override;
    size_t progress(EventSink &sink) override;
    /// Sends the ACKs deliver() queued (the notifications they answer are published by then).
    void afterPublish() override;
    std::vector<int> pollFds() const override { return {poller_.fd()}; }
    void readable(int fd) override {
        if (fd == poller_.fd()) {
            io_ready_ = true;
        }
    }
    bool arm() override {
        return !io_ready_ && completions_.empty() && resume_.empty() && acks_due_.empty() &&
               held_.empty() && !send_staging_.ready() && !recv_staging_.ready();
    }

    // Sessions
    /// The session's parameters: [tcp] connections_per_peer and chunk_bytes (both ends must
    /// agree; openSession refuses a peer whose values differ, naming both).
    std::vector<uint8_t> localBlob(PeerId, SessionSide) override;
    Status openSession(PeerId peer, SessionSide side, const SessionInfo &info,
                       uint32_t *channels) override;
    void closeSession(PeerId peer, SessionSide side, Code code, const std::string &reason) override;
    void adoptChannel(PeerId peer, SessionSide side, uint32_t index,
                      std::unique_ptr<Connection> conn) override;
    void regionRevoked(PeerId peer, RegionId r) override;
    TransportPeerReport peerReport(PeerId peer, ReportDetail want) const override;
    /// Tag workers this transport runs (0: tags on the engine thread).
    unsigned tagThreads() const { return tags_->threads(); }
    /// Bytes read from one data connection per turn before the others get theirs.
    static constexpr size_t kDefaultReadBudget = 16u << 20;
    /// The budget of the transports made from now on in this process, 0: the default (tests:
    /// a small one makes a stop at it with bytes already buffered likely).
    static void setReadBudgetForTests(size_t bytes);
    void attach(TransportHost &host) override { link_ = &host; }

private:
    struct OutSide {
        SessionInfo info;
        std::vector<std::unique_ptr<Connection>> data;
        std::unique_ptr<OutLink> link;  ///< once every data connection is up
    };
    struct InSide {
        SessionInfo info;
        std::vector<std::unique_ptr<Connection>> data;
        std::unique_ptr<InLink> link;
    };
    struct PeerData {
        std::unique_ptr<OutSide> out;
        std::unique_ptr<InSide> in;
        uint64_t writes_sent = 0;
        uint64_t bytes_sent = 0;
        uint64_t writes_received = 0;
        uint64_t bytes_received = 0;
    };

    PeerData &peer(PeerId id) { return peers_[id]; }
    void onEvent(Connection &c, uint32_t events, int64_t now);
    /// An ACK's payload: the write's status (le32), then 4 reserved bytes.
    static constexpr size_t kAckPayloadBytes = 8;
    /// An ACK's second word: the write failed because a chunk's data did not match its tag
    /// while its headers did (InLink::tagVerdict()).
    static constexpr uint32_t kAckDataChanged = 1;
    /// Reads the ACKs on one of our data connections (0; any other frame, or anything on the
    /// others, is a protocol error).
    void readAcks(PeerId id, Connection &c, int64_t now);
    /// The target ended write `seq`; false with `*error` on a protocol error.
    bool onAck(PeerId id, uint64_t seq, std::span<const uint8_t> payload, std::string *error);
    /// Delivers arrivals and queues their ACKs (afterPublish() sends them).
    size_t deliver(EventSink &sink);
    /// Destroys what closed during this call (dead_, dead_links_, dead_in_links_).
    void reapDead();
    /// Data connections whose output stopped moving for peer_timeout_ms: the peer stopped
    /// reading.
    void checkStalls(int64_t now);
    void fail(PeerId peer, SessionSide side, const std::string &reason);
    /// Reads chunk data from an inbound data connection; fails the session on errors. One that
    /// used its budget is read again next turn (resume_).
    void readIn(PeerData &p, PeerId id, Connection &c, int64_t now);
    /// Reads again the inbound data connections that stopped at their budget last turn.
    void resumeReads(int64_t now);
    /// Hands finished GPU staging copies to the links, then pumps the senders that have
    /// staged chunks ready and reads again where a chunk waited for a slot.
    size_t dispatchStaging(int64_t now);
    /// Pumps the links of held_ (ops posted with WriteOp::more).
    void sendHeld(int64_t now);
    /// Adds a staging pool's eventfd to the poller once it has started.
    void watchStaging(TcpStaging &staging, uint64_t token, bool *watched);
    /// Tags the pool finished: receivers count their chunks (or fail), senders flush on.
    void collectTags(int64_t now);

    const config::Config cfg_;
    RegionTable &regions_;
    TransportHost *link_ = nullptr;
    const bool busy_;        ///< [ipc] poll_mode = "busy": the set is asked every turn
    bool io_ready_ = false;  ///< the engine saw poller_'s fd readable
    Poller poller_;
    /// Before everything that queues tag jobs, so it is destroyed after them.
    std::unique_ptr<TagPool> tags_;
    TcpStaging send_staging_;
    TcpStaging recv_staging_;
    /// Receive buffers of host chunks, checked before they are copied into the region; after
    /// tags_ (its limit follows the workers) and before every InLink, which returns buffers.
    HostStaging host_staging_;
    bool send_watched_ = false;
    bool recv_watched_ = false;
    std::unordered_map<PeerId, PeerData> peers_;
    std::vector<Completion> completions_;
    /// Connections closed during this progress() call, destroyed at its end.
    std::vector<std::unique_ptr<Connection>> dead_;
    std::vector<std::unique_ptr<OutLink>> dead_links_;
    std::vector<std::unique_ptr<InLink>> dead_in_links_;
    int64_t last_stall_check_ms_ = 0;
    /// Inbound data connections (peer, index) that stopped at their read budget: what they
    /// have buffered is read next turn (epoll reports the socket, not our buffer).
    std::vector<std::pair<PeerId, uint32_t>> resume_;
    /// Peers whose ACKs deliver() queued on their data connection 0, sent by afterPublish().
    std::vector<PeerId> acks_due_;
    /// Peers with ops posted with WriteOp::more and not sent yet: pumped by progress().
    std::vector<PeerId> held_;
    const size_t read_budget_;
    /// TENSORLANE_TCP_ACK_DELAY_US (0: ACKs go once the notifications are out), and when the
    /// oldest of acks_due_ was queued.
    const std::chrono::microseconds ack_delay_;
    std::chrono::steady_clock::time_point acks_due_since_;
};

}  // namespace tensorlane::sidecar
