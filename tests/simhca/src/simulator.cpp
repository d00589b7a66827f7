#include "simulator.hpp"

#include "context.hpp"
#include "device.hpp"
#include "engine.hpp"
#include "sysfs_tree.hpp"

namespace tensorlane::simhca {

Simulator &Simulator::instance() {
    // Never destroyed: applications may call verbs from their own static destructors.
    static Simulator *sim = new Simulator();
    return *sim;
}

std::vector<SimDevice *> Simulator::scanDevices() {
    std::lock_guard lock(mutex_);
    std::vector<SimDevice *> found;
    const std::string root = sysfsRoot();
    if (root.empty()) {
        return found;  // no tree: no devices, like a host without RDMA hardware
    }
    for (const std::string &name : listDirectory(root + "/class/infiniband")) {
        SimDevice *dev = nullptr;
        for (auto &d : devices_) {
            if (d->name() == name) {
                dev = d.get();
            }
        }
        if (dev == nullptr) {
            auto info = loadDeviceInfo(root, name);
            if (!info) {
                continue;
            }
            devices_.push_back(
                std::make_unique<SimDevice>(std::move(*info), static_cast<int>(devices_.size())));
            dev = devices_.back().get();
        }
        found.push_back(dev);
    }
    return found;
}

SimContext *Simulator::openContext(SimDevice *dev) {
    std::lock_guard lock(mutex_);
    if (open_contexts_++ == 0) {
        engine_ = std::make_unique<Engine>();
    }
    // Re-read the device: the tree may have changed since the device list was taken.
    if (auto info = loadDeviceInfo(sysfsRoot(), dev->name())) {
        dev->setInfo(std::move(*info));
    }
    auto *ctx = new SimContext(dev);
    engine_->watchDevice(dev);
    return ctx;
}

void Simulator::closeContext(SimContext *ctx) {
    std::lock_guard lock(mutex_);
    SimDevice &dev = ctx->device();
    delete ctx;
    dev.flushCounters(true);
    if (--open_contexts_ == 0) {
        engine_.reset();
    }
}

void Simulator::flushAtExit() {
    std::unique_lock lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock()) {
        return;
    }
    for (auto &d : devices_) {
        d->flushCounters();
    }
}

namespace {

// A process that exits without closing its contexts (perftest on an error path does) still
// leaves its counters in the tree, as a real device keeps counting after the process is gone.
__attribute__((destructor)) void flushCountersAtExit() {
    Simulator::instance().flushAtExit();
}

}  // namespace

Engine *Simulator::engine() {
    std::lock_guard lock(mutex_);
    return engine_.get();
}

}  // namespace tensorlane::simhca
