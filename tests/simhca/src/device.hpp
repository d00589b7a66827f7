// A simulated device: what the tree says about it, its port counters and the contexts open on it
// (for async events). Devices live as long as the process: rdma-core also keeps ibv_device
// objects alive while any context uses them, and a rescan returns the same object per name.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device_info.hpp"
#include "handles.hpp"
#include "hw_counters.hpp"

namespace tensorlane::simhca {

/// One simulated HCA.
class SimDevice {
public:
    /// A device described by info (loaded from the tree at root).
    SimDevice(DeviceInfo info, int index);
    SimDevice(const SimDevice &) = delete;
    SimDevice &operator=(const SimDevice &) = delete;

    /// The ibv_device handed to applications.
    [[nodiscard]] ibv_device *ibv() { return &handle_.ibv; }
    /// The device behind an ibv_device this library handed out.
    [[nodiscard]] static SimDevice *from(ibv_device *d) { return handleOf<DeviceHandle>(d)->self; }
    /// The device's name (class/infiniband/<name>).
    [[nodiscard]] const std::string &name() const { return name_; }
    /// A consistent copy of what the tree said when it was last read.
    [[nodiscard]] DeviceInfo info() const;
    /// Replaces the description after the tree changed.
    void setInfo(DeviceInfo info);
    /// The counters of a port (1-based); nullptr for a port that does not exist.
    [[nodiscard]] HwCounters *counters(uint8_t port);
    /// Writes every port's counters to the tree.
    void flushCounters(bool force = false);
    /// Registers a context for async events.
    void addContext(SimContext *ctx);
    /// Unregisters a context.
    void removeContext(SimContext *ctx);
    /// Queues an async event on every context open on this device.
    void broadcastEvent(const ibv_async_event &event);
    /// Whether a port is ACTIVE (lock-free: read on every packet).
    [[nodiscard]] bool portActive(uint8_t port) const {
        return port >= 1 && port <= num_ports_ &&
               port_active_[port - 1].load(std::memory_order_relaxed);
    }
    /// The number of ports.
    [[nodiscard]] uint8_t numPorts() const { return num_ports_; }

private:
    std::string name_;
    std::string dir_;  ///< class/infiniband/<name>, fixed: read without the lock
    mutable std::mutex mutex_;
    DeviceInfo info_;
    std::vector<std::unique_ptr<HwCounters>> counters_;
    std::vector<SimContext *> contexts_;
    uint8_t num_ports_ = 0;
    std::unique_ptr<std::atomic<bool>[]> port_active_;
    DeviceHandle handle_{};
};

}  // namespace tensorlane::simhca
