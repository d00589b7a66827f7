// A small in-process "sidecar" for peer tests: a RegionTable, a PeerManager and an engine-like
// loop thread that polls wakeFd() and calls progress(), with a sink that records every event.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tensorlane/config/config.hpp"
#include "tensorlane/sidecar/peers.hpp"
#include "tensorlane/sidecar/region.hpp"
#include "tensorlane/sidecar/transport.hpp"
#include "transport/set.hpp"

namespace tensorlane::peertest {

using sidecar::Code;
using sidecar::PeerId;
using sidecar::PeerState;
using sidecar::Region;
using sidecar::RegionId;
using sidecar::RemoteRegion;
using sidecar::Status;
using sidecar::WriteOp;
using namespace std::chrono_literals;

/// A port nobody listens on right now (bound to 127.0.0.1:0, then released).
uint16_t freePort();

/// A temporary directory, removed with its files.
class TempDir {
public:
    TempDir();
    ~TempDir();
    const std::string &path() const { return path_; }
    /// Writes `content` to `name` in the directory with `mode`; returns the path.
    std::string writeFile(const std::string &name, const std::string &content,
                          unsigned mode = 0600) const;

private:
    std::string path_;
};

/// A peer key file's content (tensorlane-key-v1): the prefix and 64 copies of `digit` (a hex
/// digit), so each digit names a different key.
inline std::string keyText(char digit) {
    return "tensorlane-key-v1:" + std::string(64, digit) + "\n";
}
/// The key the tests' nodes share unless a test needs another.
inline const std::string kSecret = keyText('7');

/// Milliseconds since `t0` on the steady clock.
inline int64_t msSince(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                 t0)
        .count();
}

/// One event seen by a sink; `order` is global across all sinks of the process.
struct Event {
    enum class Kind { kCompleted, kArrived, kState, kMessage };
    Kind kind = Kind::kCompleted;
    uint64_t order = 0;
    std::chrono::steady_clock::time_point at;
    // completed
    uint64_t op_id = 0;
    Code code = Code::kOk;
    std::string reason;
    // arrived
    RegionId region = 0;
    uint32_t imm = 0;
    uint64_t offset = 0;
    uint64_t bytes = 0;
    std::string peer_name;
    // message (region, imm, offset, peer_name as for arrived)
    std::vector<uint8_t> message;
    // state
    PeerId peer = 0;
    PeerState state = PeerState::kDown;
};

/// Records every event; tests wait on it from their own thread.
class RecordingSink final : public sidecar::EventSink {
public:
    void completed(uint64_t op_id, Code status, std::string_view reason) override;
    void arrived(RegionId region, uint32_t imm, uint64_t offset, uint64_t bytes,
                 std::string_view peer_name) override;
    void messageArrived(RegionId region, uint32_t imm, uint64_t offset,
                        std::span<const uint8_t> message, std::string_view peer_name) override;
    void peerState(PeerId peer, PeerState state, std::string_view reason) override;

    /// Waits until `pred(events)` holds; false on timeout.
    bool waitFor(const std::function<bool(const std::vector<Event> &)> &pred,
                 std::chrono::milliseconds timeout);
    /// The completion of `op_id` (waits for it), or nullopt on timeout.
    std::optional<Event> completion(uint64_t op_id, std::chrono::milliseconds timeout);
    std::vector<Event> events() const;
    std::vector<Event> arrivals() const;
    /// Called on the reporting (engine) thread with each event, before it is recorded: a test
    /// looks at memory at the moment of a delivery. Set before traffic starts.
    std::function<void(const Event &)> on_event;
    /// Arrivals and messages, in the order they came.
    std::vector<Event> deliveries() const;
    size_t count(Event::Kind kind) const;

private:
    void add(Event e);
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::vector<Event> events_;
};

/// A host memory region: mmap'd anonymous memory, like AllocHost's segments.
std::shared_ptr<Region> makeHostRegion(size_t bytes);
/// Fills `n` bytes with random data with no zero byte (so "untouched" and "written" differ).
void fillRandom(unsigned char *p, size_t n, uint64_t seed);

/// Settings for one test node.
struct NodeOptions {
    std::string name;
    uint16_t port = 0;
    std::string key_file;
    std::vector<std::pair<std::string, uint16_t>> peers;  ///< name, port on 127.0.0.1
    std::function<void(config::Config &)> tweak;          ///< last word on the config
    int netns_fd = -1;                                    ///< run the node in this netns
    std::string listen_host = "127.0.0.1";
    std::vector<std::string> peer_hosts;  ///< per peer; default 127.0.0.1
    /// "tcp", or "verbs" on the simulated HCA: the node gets a simulated device of its own
    /// (simTree()); the test process must run with LD_LIBRARY_PATH at the simulator (CTest
    /// sets it for peer_tests).
    std::string transport = "tcp";
};

/// A sysfs tree with 8 simulated RoCE devices sim0..sim7 (netdevs tlp0..tlp7) on loopback
/// addresses of this process's own, made once; TENSORLANE_SYSFS_ROOT points at it.
const std::string &simTree();
/// The next of those devices in turn (a node, or a raw verbs peer, takes one of its own).
int nextSimDevice();
/// Whether this process runs on the simulated HCA (libibverbs lists its devices).
bool simulatedHcaLoaded();

/// The default test tuning: short timeouts so failure tests finish quickly.
config::Config makeConfig(const NodeOptions &o);

/// One sidecar minus its clients: a RegionTable, the remote transports and a PeerManager, built
/// and driven on its own loop thread the way the engine drives them.
class Node {
public:
    explicit Node(NodeOptions opts);
    ~Node();
    Node(const Node &) = delete;
    Node &operator=(const Node &) = delete;

    /// The status of makePeerManager + start().
    const Status &startStatus() const { return start_status_; }
    bool ok() const { return start_status_.isOk(); }

    /// Runs `f` on the loop thread and returns its result.
    template <class F>
    auto call(F f) -> decltype(f()) {
        using R = decltype(f());
        auto task = std::make_shared<std::packaged_task<R()>>(std::move(f));
        auto fut = task->get_future();
        submit([task] { (*task)(); });
        return fut.get();
    }

    /// Adds a host region (optionally exposed under `name`, which tells connected peers).
    std::shared_ptr<Region> addRegion(size_t bytes, const std::string &name = "");
    /// Exposes an existing region.
    void expose(const std::shared_ptr<Region> &r, const std::string &name);
    /// Exposes `r` to local clients only (tl_expose_access without TL_ACCESS_PEERS): the peers
    /// are not told of it.
    void exposeLocally(const std::shared_ptr<Region> &r, const std::string &name);
    /// Deregisters a region (revoked) and tells the peers.
    void revoke(RegionId id);

    /// Looks `region` up at `peer`; waits for the callback.
    std::pair<Status, RemoteRegion> lookup(const std::string &peer, const std::string &region,
                                           std::chrono::milliseconds timeout = 10s);
    /// Posts a write; returns post()'s status and the op id used.
    std::pair<Status, uint64_t> post(const std::string &peer, const std::shared_ptr<Region> &src,
                                     uint64_t src_offset, RegionId remote, uint64_t dst_offset,
                                     uint64_t bytes, uint32_t imm);
    /// post() of a silent write (`silent`) or of a message (`message` not empty, bytes 0).
    std::pair<Status, uint64_t> postOp(const std::string &peer, const std::shared_ptr<Region> &src,
                                       uint64_t src_offset, RegionId remote, uint64_t dst_offset,
                                       uint64_t bytes, uint32_t imm, bool silent,
                                       std::vector<uint8_t> message);
    bool remoteValid(const std::string &peer, RegionId remote);
    PeerState state(const std::string &peer);
    std::string statusJson();
    /// PeerManager::report(want), taken on the loop thread.
    sidecar::PeersReport report(sidecar::ReportDetail want);

    /// Stops calling progress() (a hung engine: sockets stay open, nothing is read or sent).
    void pause(bool paused) { paused_.store(paused); }
    /// How many loop iterations found wakeFd() readable.
    uint64_t wakeups() const { return wakeups_.load(); }

    sidecar::RegionTable &regions() { return regions_; }
    sidecar::PeerManager &pm() { return *pm_; }
    /// The transports, as the engine holds them (call on the loop thread).
    sidecar::TransportSet &transports() { return transports_; }
    RecordingSink sink;
    const std::string &name() const { return opts_.name; }
    uint16_t port() const { return opts_.port; }

private:
    void submit(std::function<void()> task);
    void run();

    NodeOptions opts_;
    sidecar::RegionTable regions_;
    /// The remote transports, owned here as the engine owns them (declared before pm_, which
    /// refers to them, so they go after it).
    sidecar::TransportSet transports_;
    std::unique_ptr<sidecar::PeerManager> pm_;
    Status start_status_;
    std::mutex mu_;
    std::vector<std::function<void()>> tasks_;
    int task_fd_ = -1;
    std::atomic<bool> stop_{false};
    std::atomic<bool> paused_{false};
    std::atomic<uint64_t> wakeups_{0};
    std::promise<void> started_;
    std::thread thread_;
};

/// A fresh op id, unique in the process.
uint64_t nextOpId();

/// Text the peer logger printed since the process started (a ring buffer sink).
std::vector<std::string> peerLogLines();
/// True when a peer log line contains every one of `parts`.
bool peerLogHas(const std::vector<std::string> &parts);
/// How many peer log lines so far contain every one of `parts` (the history is the process's,
/// so a test compares the counts from before and after what it did).
size_t peerLogCount(const std::vector<std::string> &parts);

/// `peer`'s entry in `n`'s status document (`peers[]`); null when it has none.
nlohmann::json peerStatus(Node &n, const std::string &peer);

}  // namespace tensorlane::peertest
