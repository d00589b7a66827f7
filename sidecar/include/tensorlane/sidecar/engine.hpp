// The sidecar's engine: one progress loop that accepts clients, drains their request rings,
// posts to transports, and routes completions and notifications back into client segments.
// Only the engine thread writes into client segments.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "tensorlane/config/config.hpp"
#include "tensorlane/sidecar/status.hpp"
#include "tensorlane/sidecar/transport.hpp"

namespace tensorlane::sidecar {

class EngineImpl;

/// The region every sidecar with peers exposes for `tensorlane diag`'s peer probe: 4 KiB that
/// peers may write, whose notifications go to no one (counted as probes_received). Names with
/// the "tensorlane." prefix are the sidecar's own; clients cannot expose them.
inline constexpr const char *kProbeRegionName = "tensorlane.probe";
inline constexpr const char *kReservedNamePrefix = "tensorlane.";

/// The daemon minus its command line, so tests can run it in-process.
class Engine {
public:
    /// Builds an engine for `cfg` (nothing is opened yet).
    static std::unique_ptr<Engine> create(const config::Config &cfg, Status *error);
    /// The same with these remote transports, in this preference order, instead of the ones
    /// [fabric] transports names (tests and embedders: a transport of their own, e.g.
    /// tests/sidecar/loop_transport.hpp). Each must say caps().remote.
    static std::unique_ptr<Engine> create(const config::Config &cfg, Status *error,
                                          std::vector<std::unique_ptr<Transport>> remote);
    ~Engine();

    /// Listens on the client socket and the peer port. Fails if either cannot be opened.
    Status start();
    /// Runs the progress loop until stop() is called (from any thread or a signal handler);
    /// after a stop() made before it, returns at once.
    void run();
    /// Asks run() to return. Async-signal-safe.
    void stop();
    /// The resolved status as JSON text (what `tensorlane status --json` prints). It reads the
    /// engine thread's state without a lock: call it before run() or once run() has returned.
    /// While run() runs, ask over the socket (tl_sidecar_status): the engine thread answers.
    std::string statusJson() const;

private:
    explicit Engine(std::unique_ptr<EngineImpl> impl);
    std::unique_ptr<EngineImpl> impl_;
};

}  // namespace tensorlane::sidecar
