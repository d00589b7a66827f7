// The simulated HCA's own thread: it receives every RoCEv2 packet (recvmmsg(2) in batches),
// places data and acknowledges without the application calling in (an HCA does not wait for
// ibv_poll_cq), runs the QPs' transport and RNR timers, watches the tree for port and GID
// changes (inotify(7)) and writes the hw_counters back. One per process, running while any
// context is open.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace tensorlane::simhca {

class Endpoint;
class SimDevice;
class SimQp;

/// The progress engine.
class Engine {
public:
    /// Starts the thread.
    Engine();
    /// Stops and joins the thread.
    ~Engine();
    Engine(const Engine &) = delete;
    Engine &operator=(const Engine &) = delete;

    /// A fresh QP number (24 bits, never 0 or 1: those are the special QPs of IB).
    [[nodiscard]] uint32_t allocateQpn();
    /// Counts a QP of dev; the first binds the device's endpoints. 0 or an errno value.
    [[nodiscard]] int addQp(SimQp *qp, SimDevice *dev);
    /// Forgets a QP (waits until the engine is not using it); the last of a device closes the
    /// device's endpoints.
    void removeQp(SimQp *qp, SimDevice *dev);
    /// Routes packets for (local_ip, qp's number) to qp.
    void bindQp(SimQp *qp, uint32_t local_ip);
    /// Stops routing packets to qp.
    void unbindQp(SimQp *qp);
    /// Flush qp's coalesced ACK after the receive batch the calling thread is running.
    void scheduleAck(SimQp *qp);

    /// Makes the engine wake by deadline (CLOCK_MONOTONIC ns) to run timers.
    void wakeFor(int64_t deadline);
    /// Watches dev's ports in the tree for state and GID changes.
    void watchDevice(SimDevice *dev);
    /// Flushes every watched device's counters now.
    void flushCounters();

private:
    void run();
    void receiveBatch(Endpoint &ep);
    static void flushAcks();
    void handleInotify();
    void runTimers(int64_t now);

    int epoll_fd_ = -1;
    int wake_fd_ = -1;
    int inotify_fd_ = -1;
    std::atomic<bool> stop_{false};
    std::atomic<int64_t> next_wake_{0};
    std::atomic<uint32_t> next_qpn_;

    // SYNC POINT: lifetime_ is held shared by the engine while it uses QPs and endpoints, and
    // exclusively by whoever removes one, so nothing is freed under the engine.
    std::shared_mutex lifetime_;
    std::mutex map_mutex_;  ///< guards the maps below (never held while taking a QP lock)
    std::unordered_map<uint64_t, SimQp *> routes_;
    std::unordered_map<SimQp *, uint64_t> route_of_;
    std::vector<SimQp *> qps_;
    std::map<SimDevice *, int> device_qps_;
    std::map<uint32_t, std::unique_ptr<Endpoint>> endpoints_;

    std::mutex watch_mutex_;
    struct Watch {
        SimDevice *dev;
        uint8_t port;
    };
    std::unordered_map<int, Watch> watches_;
    std::vector<SimDevice *> watched_;

    std::vector<SimQp *> timer_snapshot_;
    std::thread thread_;
    std::thread::id thread_id_;
    std::mutex housekeeping_mutex_;
    std::condition_variable housekeeping_cv_;
    std::thread housekeeper_;  ///< writes hw_counters back every 100 ms
};

}  // namespace tensorlane::simhca
