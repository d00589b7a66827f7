// `tensorlane bench`: the plain-TCP baselines, run between this process and a forked server
// process over loopback in the same run as the sidecar figures.
#pragma once

#include <cstdint>
#include <vector>

#include "bench_env.hpp"
#include "bench_report.hpp"

namespace tensorlane::tools::bench {

/// How long and how many times one measurement runs.
struct Budget {
    uint64_t iters = 1000;    ///< latency: round trips at most
    double duration_s = 1.0;  ///< any measurement: seconds at most (bandwidth: exactly)
    uint64_t min_iters = 5;   ///< at least this many, whatever the duration
    uint64_t warmup = 10;     ///< untimed round trips / messages first
};

/// A forked server process on 127.0.0.1 that answers ping-pong and stream connections.
class TcpBaseline {
public:
    /// Forks the server (call before the process has threads or shim connections).
    static TcpBaseline start();

    /// Ping-pong of `bytes` each way with TCP_NODELAY: appends round trips in microseconds.
    void pingPong(uint64_t bytes, const Budget &budget, std::vector<double> *samples);
    /// One stream of `bytes`-sized sends for the budget's duration, timed until the server has
    /// received the last byte.
    Bandwidth stream(uint64_t bytes, const Budget &budget);

private:
    int connectServer(uint32_t mode, uint64_t bytes);
    Child server_;
    uint16_t port_ = 0;
};

}  // namespace tensorlane::tools::bench
