// The process-wide state of the simulated HCA: the devices found in the tree and the engine,
// which runs while any context is open (started by the first ibv_open_device(), stopped by the
// last ibv_close_device(), so a program that closes everything leaves no thread behind).
#pragma once

#include <memory>
#include <mutex>
#include <vector>

namespace tensorlane::simhca {

class Engine;
class SimContext;
class SimDevice;

/// The simulator.
class Simulator {
public:
    /// The process-wide instance.
    static Simulator &instance();
    /// Rescans the tree; returns the devices it describes now.
    [[nodiscard]] std::vector<SimDevice *> scanDevices();
    /// Opens a context (starts the engine if it is the first).
    [[nodiscard]] SimContext *openContext(SimDevice *dev);
    /// Closes a context (stops the engine after the last).
    void closeContext(SimContext *ctx);
    /// Writes every device's counters to the tree (at process exit).
    void flushAtExit();
    /// The engine; valid while a context is open.
    [[nodiscard]] Engine *engine();

private:
    std::mutex mutex_;
    std::vector<std::unique_ptr<SimDevice>> devices_;
    std::unique_ptr<Engine> engine_;
    int open_contexts_ = 0;
};

}  // namespace tensorlane::simhca
