// Transport "verbs": write-with-immediate over RoCEv2 RC queue pairs through rdma-core
// (docs/verbs.md). One-way sessions, like the tcp transport's: the sending side of our session
// to a peer (SendSession: our writes) and the receiving side of its session to us (RecvSession:
// its writes). Each side has its own protection domain, so a peer's rkeys reach only memory
// exposed to it, and [fabric] qps_per_peer RC QPs.
//
// A write of any size: its descriptor (the writer's immediate, region, offset, bytes) is
// written into the receiver's descriptor ring, then its data, striped over the QPs in work
// requests no larger than the port allows; the last work request of each stripe is a
// WRITE_WITH_IMM whose immediate names the write and its stripe count. The receiver notifies
// the owner once it has every stripe's immediate, in sequence order (docs/verbs.md explains why
// that is correct across QPs, retransmissions and a peer that dies mid-write).
#pragma once

#include <infiniband/verbs.h>

#include <spdlog/fwd.h>
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "net/connection.hpp"
#include "tensorlane/config/config.hpp"
#include "tensorlane/sidecar/fabric.hpp"
#include "transport/set.hpp"
#include "transport/verbs/device.hpp"
#include "transport/verbs/gdr_flush.hpp"
#include "transport/verbs/mr_cache.hpp"
#include "transport/verbs/qp.hpp"
#include "transport/verbs/recv_window.hpp"
#include "transport/verbs/registrar.hpp"
#include "transport/verbs/wire.hpp"

namespace tensorlane::sidecar {

/// The "tensorlane.sidecar.verbs" logger (stderr), created on first use.
spdlog::logger &verbsLog();

class VerbsTransport;

/// Our writes to one peer.
class SendSession {
public:
    SendSession(VerbsTransport &t, PeerId peer, std::shared_ptr<ibv_pd> pd);
    ~SendSession();
    /// Creates the CQ and the QPs (INIT); their endpoints go into SELECT.
    Status create(uint32_t qps);
    VerbsBlob blob() const;
    /// Connects to the receiver's QPs (RTR, RTS) and takes its descriptor ring.
    Status connect(const VerbsBlob &remote);
    /// kAgain while the window, the ring's credits, the send queues, a key or a registration
    /// is not there yet. A silent write is a write whose descriptor says so; a message
    /// (WriteOp::message, checked by VerbsTransport::post) is a descriptor with its bytes and
    /// no data.
    Status post(const WriteOp &op);
    /// Polls the CQ (a batch); completed writes go to `done`. False with `*error` when a work
    /// completion failed (the session is dead then).
    bool poll(std::vector<Completion> *done, std::string *error);
    /// Posts more work requests of writes whose stripes wait for send-queue room.
    void pump();
    bool onMessage(VerbsMsg m, std::span<const uint8_t> payload, std::string *error);
    void failAll(Code code, const std::string &reason, std::vector<Completion> *out);
    /// Arms the CQ; false when completions are already waiting.
    bool arm();
    size_t inFlight() const { return writes_.size(); }
    MrCache &mrs() { return mrs_; }
    /// Its figures into `r` (send_qps, work_requests, completion_errors) and `*j` (the
    /// status document's "send" object).
    void report(TransportPeerReport *r, nlohmann::json *j) const;

private:
    struct Stripe {
        uint32_t qp = 0;
        uint64_t begin = 0;  ///< offset in the write
        uint64_t end = 0;
        uint64_t next = 0;  ///< first byte not yet in a posted work request
    };
    struct Write {
        uint64_t seq = 0;
        WriteOp op;
        RegionKey key;
        MrView src;
        std::vector<Stripe> stripes;
        uint32_t stripes_done = 0;
        bool descriptor_posted = false;
        bool posted_all = false;
        bool done = false;
        /// A message: it ends once its WRITE_WITH_IMM is acknowledged (`acked`) and the
        /// receiver's CREDIT covers it (it judged it: delivered, or dropped and said so).
        bool message = false;
        bool acked = false;
        Code code = Code::kOk;
        std::string reason;  ///< with a `code` the receiver gave (a message it dropped)
    };
    struct QpState {
        verbs_detail::QpPtr qp;
        QpEndpoint local;
        uint32_t outstanding = 0;  ///< WRs posted and not known complete
        /// Signalled WRs posted, oldest first: their wr_id and how many WRs each retires.
        std::deque<std::pair<uint64_t, uint32_t>> signalled;
        uint32_t since_signal = 0;
    };

    /// Work requests for one QP, chained and posted with one ibv_post_send.
    struct Chain {
        std::vector<ibv_send_wr> wrs;
        std::vector<ibv_sge> sges;
    };

    /// Posts what fits of `w` now; returns false when a post failed (then the session fails).
    bool postWrite(Write &w, std::string *error);
    Write *find(uint64_t seq);
    /// Ends `w` (once): its completion into `done`, its key's use released.
    void finish(Write &w, Code code, std::string reason, std::vector<Completion> *done);
    /// Ends the messages the receiver's last CREDIT covers whose acknowledgement came.
    void finishCredited(std::vector<Completion> *done);
    /// Takes one work completion; false when it failed (then `*error` says how, once).
    bool onCompletion(const ibv_wc &wc, std::vector<Completion> *done, std::string *error,
                      bool first_error);

    VerbsTransport &t_;
    PeerId peer_;
    std::shared_ptr<ibv_pd> pd_;
    MrCache mrs_;
    verbs_detail::CqPtr cq_;
    std::vector<QpState> qps_;
    QpParams params_;
    VerbsBlob remote_;
    bool connected_ = false;
    /// The descriptors we send, staged in memory registered in our PD (the WR's source).
    std::vector<WriteDescriptor> staging_;
    verbs_detail::MrPtr staging_mr_;
    std::unordered_map<uint64_t, RegionKey> keys_;
    std::unordered_map<uint64_t, uint32_t> key_users_;  ///< writes in flight per region
    std::vector<uint64_t> keys_revoking_;               ///< KEY_DEL waiting for those writes
    std::set<uint64_t> keys_revoked_;                   ///< no write may use these any more
    /// Regions whose key we are waiting for, and since when (a peer that never sends one).
    std::unordered_map<uint64_t, int64_t> key_waits_;
    std::deque<Write> writes_;
    uint64_t next_seq_ = 1;
    uint64_t credited_ = 0;  ///< descriptors the receiver consumed (its last CREDIT)
    size_t next_qp_ = 0;
    uint64_t posted_wrs_ = 0;
    uint64_t completed_writes_ = 0;  ///< messages included
    uint64_t messages_sent_ = 0;
    uint64_t errors_ = 0;
    std::vector<ibv_wc> stash_;  ///< completions arm() found after arming
    std::vector<Chain> chains_;  ///< postWrite()'s work requests per QP, reused
};

/// Its writes to us.
class RecvSession {
public:
    RecvSession(VerbsTransport &t, PeerId peer, std::shared_ptr<ibv_pd> pd, std::string peer_name);
    ~RecvSession();
    /// Creates the CQ, the QPs (connected to the sender's), the receive queues and the ring.
    Status create(const VerbsBlob &sender);
    VerbsBlob blob() const;
    /// Polls the CQ (a batch) and delivers what is complete, in order. False with `*error` on
    /// a failed completion or a descriptor that breaks the protocol. `closing`: the session is
    /// being torn down; every write whose stripes all came is still delivered (its writer was
    /// told it completed), flush errors are expected.
    bool poll(EventSink &sink, std::string *error, bool closing = false);
    /// The session is being torn down: its QPs go to ERR now, so the HCA acknowledges no write
    /// from here on (the sender's tries time out and its writes fail) and every receive WQE
    /// comes back on the CQ, flushed. Until the QPs are destroyed, a write acknowledged after
    /// the last drain would have told its writer OK and its owner nothing.
    void stop();
    /// After stop(): every receive WQE posted has completed, so no completion of a write its
    /// writer heard OK for is still to come.
    bool drained() const;
    /// Registers `r` for remote writes by this peer and sends its key when registered.
    void expose(const std::shared_ptr<Region> &r);
    /// Tells the sender to stop using `id`'s key; its MR goes once the sender says it has, or
    /// [security] revoke_timeout_ms later (expireRevocations()), whichever comes first.
    void revoke(RegionId id);
    /// Deregisters the MRs of revocations the peer did not confirm by their deadline.
    void expireRevocations(int64_t now_ms);
    /// Whether a revocation waits for the peer's KEY_DEL_DONE.
    bool revoking() const { return revoking_ != 0; }
    bool onMessage(VerbsMsg m, std::span<const uint8_t> payload, std::string *error);
    /// Sends the keys whose registrations finished.
    void sendReadyKeys();
    bool arm();
    MrCache &mrs() { return mrs_; }
    /// Its figures into `r` (receive_qps) and `*j` (the status document's "receive" object).
    void report(TransportPeerReport *r, nlohmann::json *j) const;

private:
    struct Exposed {
        std::shared_ptr<Region> region;
        bool key_sent = false;
        bool revoking = false;
        int64_t revoke_by = 0;  ///< monotonic ms: its MR goes then, confirmed or not
    };
    /// Takes one work completion (counts its receive WQE in reposts_); false on an error.
    bool onCompletion(const ibv_wc &wc, std::string *error, bool closing);
    bool deliver(EventSink &sink, std::string *error, bool closing);
    /// Whether writes into `r` are flushed before their owner hears of them ([fabric]
    /// gdr_flush: on: always; auto: CUDA memory; off: never).
    bool needsFlush(const Region &r) const;
    /// The access of `r`'s MR in this domain: remote write, and remote read for the flush.
    unsigned accessFor(const Region &r) const;
    /// Posts a flush READ into `r` covering every write up to `upto`; false on failure.
    bool startFlush(const Region &r, uint64_t upto, std::string *error);
    void postRecvs(size_t qp, uint32_t n);
    void credit(bool force);

    VerbsTransport &t_;
    PeerId peer_;
    std::shared_ptr<ibv_pd> pd_;
    std::string peer_name_;
    MrCache mrs_;
    verbs_detail::CqPtr cq_;
    std::vector<verbs_detail::QpPtr> qps_;
    std::vector<QpEndpoint> local_;
    QpParams params_;
    uint32_t rq_depth_ = 0;
    /// The ring the sender writes descriptors into; registered for remote writes here only.
    std::vector<WriteDescriptor> ring_;
    verbs_detail::MrPtr ring_mr_;
    RecvWindow window_;
    uint64_t consumed_ = 0;
    uint64_t credit_sent_ = 0;
    std::map<RegionId, Exposed> exposed_;
    size_t revoking_ = 0;           ///< entries of exposed_ waiting for KEY_DEL_DONE
    uint64_t writes_received_ = 0;  ///< silent ones included
    uint64_t silent_received_ = 0;
    uint64_t messages_received_ = 0;
    uint64_t bytes_received_ = 0;
    uint64_t dropped_ = 0;  ///< notifications for regions revoked meanwhile
    GdrFlusher flusher_;
    uint64_t flushed_upto_ = 0;  ///< writes up to this sequence number are flushed
    bool flush_in_flight_ = false;
    uint64_t flushes_ = 0;
    std::vector<ibv_wc> stash_;              ///< completions arm() found after arming
    std::vector<uint32_t> reposts_;          ///< receive WQEs consumed per QP in this poll()
    std::vector<uint32_t> outstanding_;      ///< receive WQEs posted and not completed, per QP
    std::vector<ibv_recv_wr> recv_scratch_;  ///< postRecvs()'s work requests, reused
};

class VerbsTransport final : public Transport {
public:
    VerbsTransport(const config::Config &cfg, RegionTable &regions, FabricSelection selection);
    ~VerbsTransport() override;

    /// Opens the device and starts the event and registration threads.
    Status init();

    // Transport
    const char *name() const override { return "verbs"; }
    TransportCaps caps() const override;
    /// Registration is lazy and per protection domain (at first use, on the registrar's
    /// thread); nothing to do when a region is created.
    Status registerRegion(Region &) override { return Status::ok(); }
    void deregisterRegion(RegionId r) override;
    Status post(const WriteOp &op) override;
    size_t progress(EventSink &sink) override;
    std::vector<int> pollFds() const override;
    bool arm() override;

    // Sessions
    bool available() const override { return available_; }
    std::vector<uint8_t> localBlob(PeerId peer, SessionSide side) override;
    Status openSession(PeerId peer, SessionSide side, const SessionInfo &info,
                       uint32_t *channels) override;
    void closeSession(PeerId peer, SessionSide side, Code code, const std::string &reason) override;
    /// The session's verbs channel: one authenticated connection that carries this transport's
    /// messages (KEY_ADD, KEY_DEL, KEY_DEL_DONE, CREDIT) both ways.
    void adoptChannel(PeerId peer, SessionSide side, uint32_t index,
                      std::unique_ptr<Connection> conn) override;
    void readable(int fd) override;
    TransportPeerReport peerReport(PeerId peer, ReportDetail want) const override;
    void attach(TransportHost &host) override { link_ = &host; }
    void regionExposed(PeerId peer, const std::shared_ptr<Region> &r) override;
    void regionRevoked(PeerId peer, RegionId r) override;

    // For the sessions.
    const config::Config &config() const { return cfg_; }
    const FabricSelection &selection() const { return sel_; }
    VerbsDevice &device() { return *device_; }
    Registrar &registrar() { return registrar_; }
    RegionTable &regions() { return regions_; }
    TransportHost &link() { return *link_; }
    /// Queues one of this transport's messages on the verbs channel of `peer`'s session `side`
    /// (kept until the channel is up; sent at the end of this turn). kPeer when that session
    /// is gone.
    Status sendMsg(PeerId peer, SessionSide side, VerbsMsg m, std::vector<uint8_t> payload);
    /// The QP parameters for a session whose sender announced `tc`/`sl` and `mtu`.
    QpParams qpParams(uint8_t tc, uint8_t sl, uint32_t peer_mtu) const;
    std::vector<Completion> &completions() { return completions_; }
    /// A revocation `peer` did not confirm in time (its MR was deregistered anyway).
    void countForcedRevocation(PeerId peer) { ++forced_revocations_[peer]; }
    uint64_t forcedRevocations(PeerId peer) const {
        auto it = forced_revocations_.find(peer);
        return it == forced_revocations_.end() ? 0 : it->second;
    }

private:
    /// A session's verbs channel (docs/verbs.md, "Messages").
    struct Channel {
        std::unique_ptr<Connection> conn;
        /// Messages queued before the connection arrived, in order.
        std::vector<std::pair<VerbsMsg, std::vector<uint8_t>>> early;
    };
    struct PeerData {
        std::unique_ptr<SendSession> out;
        bool out_connected = false;  ///< its QPs are connected
        Channel out_ch;
        std::unique_ptr<RecvSession> in;
        Channel in_ch;
    };
    /// Reads the channels that have input, dispatches their messages, flushes their output.
    void pumpChannels(int64_t now);
    void onChannelEvent(Connection &c, uint32_t events, int64_t now);
    bool onMessage(PeerId peer, SessionSide side, uint64_t arg, std::span<const uint8_t> payload,
                   std::string *error);
    /// Closes a session's channel (its connection is destroyed at the end of the turn).
    void closeChannel(Channel &ch);
    void handleEvents();
    /// Reads the port and the GID table again (after they settled) and, when usable, takes
    /// the new selection for the sessions built from now on.
    void reselect();
    /// Whether the device still has our GID at our index.
    bool gidMatchesDevice() const;
    /// How long the GID table must stay unchanged before it is read again.
    static constexpr int64_t kSettleMs = 100;
    void fail(PeerId peer, SessionSide side, const std::string &reason);
    std::shared_ptr<ibv_pd> newPd();

    const config::Config cfg_;
    RegionTable &regions_;
    FabricSelection sel_;
    TransportHost *link_ = nullptr;
    std::unique_ptr<VerbsDevice> device_;
    Registrar registrar_;
    bool available_ = false;
    std::unordered_map<PeerId, PeerData> peers_;
    std::vector<Completion> completions_;
    std::vector<std::unique_ptr<SendSession>> dead_out_;
    std::vector<std::unique_ptr<RecvSession>> dead_in_;
    /// Receiving sides torn down (stopped: RecvSession::stop()), drained by progress() until
    /// every receive WQE has come back or kDrainMs passed, then destroyed.
    struct Closing {
        std::unique_ptr<RecvSession> in;
        int64_t until = 0;  ///< monotonic ms
    };
    static constexpr int64_t kDrainMs = 500;
    std::vector<Closing> closing_in_;
    /// Stops `in` and queues it on closing_in_.
    void retire(std::unique_ptr<RecvSession> in);
    uint64_t async_events_ = 0;
    int64_t reselect_at_ = 0;  ///< monotonic ms when reselect() is due; 0: not due
    std::string last_event_;
    /// [ipc] poll_mode = "busy": the engine never sleeps, so no CQ is ever armed (an armed CQ
    /// makes the HCA signal the completion channel for every completion) and no channel is
    /// read: the data path makes no system call of ours.
    bool busy_ = false;
    /// A CQ was armed since the channel was last drained: only then can it hold events.
    bool cq_armed_ = false;
    std::vector<Completion> done_scratch_;  ///< progress()'s batch, reused (keeps its capacity)
    /// The sessions' verbs channels, in an epoll set of their own (its fd is in pollFds()).
    Poller chan_poller_;
    bool chan_readable_ = false;  ///< readable() saw chan_poller_'s fd
    bool chan_output_ = false;    ///< a message was queued on a channel this turn
    bool chan_buffered_ = false;  ///< a channel arrived with messages already read
    std::vector<std::unique_ptr<Connection>> dead_conns_;
    /// Per peer, across its sessions: revocations forced by [security] revoke_timeout_ms.
    std::unordered_map<PeerId, uint64_t> forced_revocations_;
};

}  // namespace tensorlane::sidecar
