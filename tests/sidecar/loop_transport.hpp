// The example transport: everything a remote transport must do behind
// tensorlane/sidecar/transport.hpp, in one small file, for engines that share a process (tests).
//
// A LoopFabric stands in for the network: each engine's LoopTransport registers under its node
// name. The bootstrap blob is that name; a write is a memcpy from the writer's source region
// into the region the receiving transport was told is exposed to the writer, after the same
// bounds check a NIC makes against a key. The receiver hears of it on its own engine thread
// (an inbox and an eventfd in pollFds()), the writer gets completed() from its progress().
//
// What a real transport adds: its own channels (TransportHost::openChannels, adoptChannel),
// blobs with versions and addresses, keys per peer (regionExposed sends one), completions that
// come back over the wire. Faults for tests: post() may answer kAgain a number of times, writes
// may be held (in flight, not yet copied) until release(), and a session may be failed from the
// transport's side as a protocol error would.
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tensorlane/sidecar/transport.hpp"

namespace tltest {

namespace tls = tensorlane::sidecar;

class LoopTransport;

/// The wire id tests use: the top bit, which no production transport takes.
inline constexpr uint32_t kTransportLoop = 1u << 31;

/// The "network" between the LoopTransports of one process.
class LoopFabric {
public:
    void join(const std::string &node, LoopTransport *t) {
        std::lock_guard lock(mutex_);
        nodes_[node] = t;
    }
    void leave(const std::string &node) {
        std::lock_guard lock(mutex_);
        nodes_.erase(node);
    }
    LoopTransport *find(const std::string &node) {
        std::lock_guard lock(mutex_);
        auto it = nodes_.find(node);
        return it == nodes_.end() ? nullptr : it->second;
    }

private:
    std::mutex mutex_;
    std::map<std::string, LoopTransport *> nodes_;
};

class LoopTransport final : public tls::Transport {
public:
    LoopTransport(LoopFabric &fabric, std::string node) : fabric_(fabric), node_(std::move(node)) {
        efd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        fabric_.join(node_, this);
    }
    ~LoopTransport() override {
        fabric_.leave(node_);
        ::close(efd_);
    }
    LoopTransport(const LoopTransport &) = delete;
    LoopTransport &operator=(const LoopTransport &) = delete;

    // ----- what it can do
    const char *name() const override { return "loop"; }
    tls::TransportCaps caps() const override {
        tls::TransportCaps c;
        c.host_memory = true;  // memcpy: no CUDA memory
        c.remote = true;
        c.ordered = true;  // one FIFO per direction
        c.wire_id = kTransportLoop;
        return c;
    }

    // ----- memory: nothing to register (a real one makes MRs or staging here)
    tls::Status registerRegion(tls::Region &) override { return tls::Status::ok(); }
    void deregisterRegion(tls::RegionId) override {}

    // ----- sessions
    void attach(tls::TransportHost &host) override { host_ = &host; }
    std::vector<uint8_t> localBlob(tls::PeerId, tls::SessionSide) override {
        return {node_.begin(), node_.end()};  // a real blob is versioned: see tcp's
    }
    tls::Status openSession(tls::PeerId peer, tls::SessionSide side, const tls::SessionInfo &info,
                            uint32_t *channels) override {
        const std::string other(info.remote_blob.begin(), info.remote_blob.end());
        if (fabric_.find(other) == nullptr) {
            return {tls::Code::kPeer, "no loop transport named '" + other + "'"};
        }
        std::lock_guard lock(mutex_);
        if (side == tls::SessionSide::kIn) {
            in_[peer] = other;               // its writes name it by its node name
            names_[other] = info.peer_name;  // and arrive as the peer the file calls it
            *channels = 0;                   // no connections of our own to accept
            return tls::Status::ok();
        }
        out_[peer] = Out{other};
        host_->sessionReady(peer);  // nothing to set up: writes may go now
        return tls::Status::ok();
    }
    void closeSession(tls::PeerId peer, tls::SessionSide side, tls::Code code,
                      const std::string &reason) override {
        std::lock_guard lock(mutex_);
        if (side == tls::SessionSide::kIn) {
            in_.erase(peer);
            return;
        }
        auto it = out_.find(peer);
        if (it == out_.end()) {
            return;
        }
        // Every write still in flight ends, once, with the session's reason.
        for (const tls::WriteOp &op : it->second.held) {
            done_.push_back(Done{op.op_id, code, reason});
        }
        out_.erase(it);
        ring();
    }
    void regionExposed(tls::PeerId peer, const std::shared_ptr<tls::Region> &r) override {
        std::lock_guard lock(mutex_);
        auto it = in_.find(peer);
        if (it != in_.end()) {
            exposed_[{it->second, r->id}] = r;  // what a key would cover
        }
    }
    void regionRevoked(tls::PeerId peer, tls::RegionId r) override {
        std::lock_guard lock(mutex_);
        auto it = in_.find(peer);
        if (it != in_.end()) {
            exposed_.erase({it->second, r});
        }
    }

    // ----- the data path
    tls::Status post(const tls::WriteOp &op) override {
        std::unique_lock lock(mutex_);
        auto it = out_.find(op.peer);
        if (it == out_.end()) {
            return {tls::Code::kPeer, "no loop session to that peer"};
        }
        if (again_.load() > 0) {
            --again_;
            return {tls::Code::kAgain, "the loop is full (test)"};
        }
        if (hold_.load() || !it->second.held.empty()) {
            it->second.held.push_back(op);  // in flight; release() sends it, in order
            return tls::Status::ok();
        }
        const std::string to = it->second.node;
        lock.unlock();
        send(to, op);
        return tls::Status::ok();
    }
    size_t progress(tls::EventSink &sink) override {
        uint64_t v;
        (void)!::read(efd_, &v, sizeof v);
        std::deque<Arrival> arrivals;
        std::deque<Done> done;
        if (fail_.exchange(false)) {
            std::vector<tls::PeerId> peers;
            {
                std::lock_guard lock(mutex_);
                for (auto &[peer, o] : out_) {
                    peers.push_back(peer);
                }
            }
            for (tls::PeerId peer : peers) {  // on the engine thread, as TransportHost asks
                host_->failSession(peer, tls::SessionSide::kOut, "loop: a protocol error (test)");
            }
        }
        {
            std::lock_guard lock(mutex_);
            arrivals.swap(inbox_);
            done.swap(done_);
        }
        for (const Arrival &a : arrivals) {
            sink.arrived(a.region, a.imm, a.offset, a.bytes, a.peer_name);
        }
        for (const Done &d : done) {
            sink.completed(d.op_id, d.code, d.reason);
            if (duplicate_.load()) {
                sink.completed(d.op_id, d.code, d.reason);  // a buggy transport's second report
            }
        }
        return arrivals.size() + done.size();
    }
    std::vector<int> pollFds() const override { return {efd_}; }
    bool arm() override {
        std::lock_guard lock(mutex_);
        return inbox_.empty() && done_.empty();
    }

    // ----- faults (any thread)
    /// The next `n` posts answer kAgain.
    void refuseNext(int n) { again_ = n; }
    /// While on, posts are taken but held in flight (not copied, not completed).
    void hold(bool on) { hold_ = on; }
    /// Sends the held writes, in order.
    void release() {
        std::vector<std::pair<std::string, tls::WriteOp>> go;
        {
            std::lock_guard lock(mutex_);
            hold_ = false;
            for (auto &[peer, o] : out_) {
                for (const tls::WriteOp &op : o.held) {
                    go.emplace_back(o.node, op);
                }
                o.held.clear();
            }
        }
        for (auto &[to, op] : go) {
            send(to, op);
        }
    }
    /// Each completion is reported twice (the engine must end the write once).
    void duplicateCompletions(bool on) { duplicate_ = on; }
    /// How many writes are held now.
    size_t held() {
        std::lock_guard lock(mutex_);
        size_t n = 0;
        for (auto &[peer, o] : out_) {
            n += o.held.size();
        }
        return n;
    }
    /// The next progress() fails our sessions to every peer from the transport's side, as a
    /// protocol error found on the wire would (TransportHost::failSession).
    void failSessions() {
        fail_ = true;
        ring();
    }

private:
    struct Out {
        std::string node;               ///< the receiving LoopTransport's node name
        std::deque<tls::WriteOp> held;  ///< in flight, not sent yet
    };
    struct Arrival {
        tls::RegionId region;
        uint32_t imm;
        uint64_t offset, bytes;
        std::string peer_name;
    };
    struct Done {
        uint64_t op_id;
        tls::Code code;
        std::string reason;
    };

    /// The wire: the receiver checks the write against what it exposed to us, copies, queues
    /// the arrival on its side and the completion on ours.
    void send(const std::string &to, const tls::WriteOp &op) {
        LoopTransport *rx = fabric_.find(to);
        Done d{op.op_id, tls::Code::kOk, {}};
        if (rx == nullptr) {
            d = Done{op.op_id, tls::Code::kPeer, "the receiving transport is gone"};
        } else if (!rx->deliver(node_, op)) {
            d = Done{op.op_id, tls::Code::kNotFound, "not exposed to us, or out of bounds"};
        }
        std::lock_guard lock(mutex_);
        done_.push_back(std::move(d));
        ring();
    }
    bool deliver(const std::string &from, const tls::WriteOp &op) {
        std::lock_guard lock(mutex_);
        auto it = exposed_.find({from, op.remote_region});
        if (it == exposed_.end() || !it->second->contains(op.dst_offset, op.bytes) ||
            !op.src->contains(op.src_offset, op.bytes)) {
            return false;  // what a NIC does with a bad rkey or range: nothing lands
        }
        std::memcpy(it->second->base + op.dst_offset, op.src->base + op.src_offset, op.bytes);
        inbox_.push_back(Arrival{op.remote_region, op.imm, op.dst_offset, op.bytes, names_[from]});
        ring();
        return true;
    }
    void ring() {
        const uint64_t one = 1;
        (void)!::write(efd_, &one, sizeof one);
    }

    LoopFabric &fabric_;
    const std::string node_;
    int efd_ = -1;
    tls::TransportHost *host_ = nullptr;
    std::mutex mutex_;  // the fabric's threads (writers' engines) against ours
    std::map<tls::PeerId, Out> out_;
    std::map<tls::PeerId, std::string> in_;     ///< peer -> its node name (its blob)
    std::map<std::string, std::string> names_;  ///< node name -> our name for the peer
    std::map<std::pair<std::string, tls::RegionId>, std::shared_ptr<tls::Region>> exposed_;
    std::deque<Arrival> inbox_;
    std::deque<Done> done_;
    std::atomic<int> again_{0};
    std::atomic<bool> hold_{false};
    std::atomic<bool> duplicate_{false};
    std::atomic<bool> fail_{false};
};

}  // namespace tltest
