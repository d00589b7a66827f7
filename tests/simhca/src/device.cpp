#include "device.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "context.hpp"

namespace tensorlane::simhca {

SimDevice::SimDevice(DeviceInfo info, int index)
    : name_(info.name), dir_(info.dir), info_(std::move(info)) {
    handle_.self = this;
    ibv_device &d = handle_.ibv;
    d.node_type = IBV_NODE_CA;
    d.transport_type = IBV_TRANSPORT_IB;  // RoCE devices report IB transport (verbs.h)
    std::snprintf(d.name, sizeof(d.name), "%s", name_.c_str());
    std::snprintf(d.dev_name, sizeof(d.dev_name), "uverbs%d", index);
    std::snprintf(d.dev_path, sizeof(d.dev_path), "/sys/class/infiniband_verbs/uverbs%d", index);
    std::snprintf(d.ibdev_path, sizeof(d.ibdev_path), "%s", info_.dir.c_str());
    num_ports_ = static_cast<uint8_t>(info_.ports.size());
    port_active_ = std::make_unique<std::atomic<bool>[]>(num_ports_);
    for (size_t p = 0; p < info_.ports.size(); ++p) {
        port_active_[p].store(info_.ports[p].state == IBV_PORT_ACTIVE);
        auto c = std::make_unique<HwCounters>();
        c->load(info_.dir + "/ports/" + std::to_string(p + 1) + "/hw_counters");
        counters_.push_back(std::move(c));
    }
}

DeviceInfo SimDevice::info() const {
    std::lock_guard lock(mutex_);
    return info_;
}

void SimDevice::setInfo(DeviceInfo info) {
    std::lock_guard lock(mutex_);
    // Ports cannot be added to a device at run time; keep the counters of those that exist.
    info.ports.resize(info_.ports.size());
    info_ = std::move(info);
    for (size_t p = 0; p < info_.ports.size(); ++p) {
        port_active_[p].store(info_.ports[p].state == IBV_PORT_ACTIVE, std::memory_order_relaxed);
    }
}

HwCounters *SimDevice::counters(uint8_t port) {
    if (port < 1 || port > counters_.size()) {
        return nullptr;
    }
    return counters_[port - 1].get();
}

void SimDevice::flushCounters(bool force) {
    for (size_t p = 0; p < counters_.size(); ++p) {
        counters_[p]->flush(dir_ + "/ports/" + std::to_string(p + 1) + "/hw_counters", force);
    }
}

void SimDevice::addContext(SimContext *ctx) {
    std::lock_guard lock(mutex_);
    contexts_.push_back(ctx);
}

void SimDevice::removeContext(SimContext *ctx) {
    std::lock_guard lock(mutex_);
    contexts_.erase(std::remove(contexts_.begin(), contexts_.end(), ctx), contexts_.end());
}

void SimDevice::broadcastEvent(const ibv_async_event &event) {
    std::lock_guard lock(mutex_);
    for (SimContext *ctx : contexts_) {
        ctx->events().push(event);
    }
}

}  // namespace tensorlane::simhca
