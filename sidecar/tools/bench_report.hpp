// `tensorlane bench`: results, the progress line, and the table / CSV / JSON outputs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tensorlane::tools::bench {

/// Raw samples of one size, in microseconds: round trips and, where the responder left its
/// timestamps, the parts of each (A->B until B's worker is notified, B's turnaround until its
/// echo is posted, B->A until A's worker is notified).
struct LatencySamples {
    std::vector<double> rtt;
    std::vector<double> a_to_b;
    std::vector<double> b_turn;
    std::vector<double> b_to_a;
};

/// Round-trip times of one size, in microseconds.
struct Latency {
    uint64_t iters = 0;
    double p50_us = 0;
    double p99_us = 0;
    double avg_us = 0;
    double min_us = 0;
    /// Medians of the parts of the round trip; negative when not measured (plain TCP).
    double a_to_b_p50_us = -1;
    double b_turn_p50_us = -1;
    double b_to_a_p50_us = -1;
    /// Summarises `samples` (sorted in place).
    static Latency of(std::vector<double> &samples_us);
    /// The same, with the parts.
    static Latency of(LatencySamples &samples);
};

/// Bytes moved in a time.
struct Bandwidth {
    uint64_t writes = 0;
    uint64_t bytes = 0;
    double seconds = 0;
    double gbps() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
};

/// Everything measured for one size; a field is empty when that part did not run.
struct SizeResult {
    uint64_t bytes = 0;
    std::optional<Latency> lat;
    std::optional<Latency> tcp_lat;
    std::optional<Bandwidth> bw;
    std::optional<Bandwidth> tcp_bw;
    /// Sidecar p50 over plain TCP p50 (lower is better).
    std::optional<double> latRatio() const;
    /// Sidecar fastest round trip over plain TCP's fastest: the least disturbed by a noisy
    /// machine (a preempted baseline can make the p50 ratio look good).
    std::optional<double> latMinRatio() const;
    /// Sidecar GB/s over plain TCP GB/s (higher is better).
    std::optional<double> bwRatio() const;
};

/// How the run was set up, for the report's header and the JSON.
struct RunInfo {
    std::string date;  ///< ISO 8601, local time
    std::string host;  ///< uname nodename and CPU count
    std::string mode;  ///< "loopback" or "attached"
    /// Loopback: the sidecars' [fabric] transport ("tcp" or "verbs"); attached: empty.
    std::string transport;
    std::string devices;  ///< verbs loopback: node-a's and node-b's devices, "sim0,sim1"
    std::string local_node;
    std::string peer_node;
    uint32_t connections = 0;  ///< 0: the sidecars' own setting
    uint64_t chunk_bytes = 0;
    std::string poll_mode;         ///< loopback: what the sidecars resolved [ipc] poll_mode to
    std::string poll_mode_reason;  ///< and why (the sidecar's status)
    int spin_us = -1;              ///< negative: the sidecars' own setting
    uint32_t window = 0;
    uint64_t iters = 0;
    double duration_s = 0;
    uint32_t rounds = 1;
};

/// Goals from the issue, checked in the report.
constexpr double kLatGoalRatio = 2.0;  ///< 64-byte round trip at most 2x plain TCP
constexpr uint64_t kLatGoalBytes = 64;
constexpr double kBwGoalRatio = 0.8;           ///< at least 80% of one TCP stream ...
constexpr uint64_t kBwGoalMinBytes = 4 << 20;  ///< ... for writes of 4 MiB and up

/// "64 B", "4 KiB", "64 MiB".
std::string formatBytes(uint64_t bytes);
/// Parses "4096", "4K", "4KiB", "1M", "1G" (binary multiples). nullopt when malformed.
std::optional<uint64_t> parseBytes(const std::string &text);
/// Parses a size list: "64,4K,1M" and/or ranges "64-64M" (powers of 4 from the first). Sorted,
/// unique. Throws BenchError when malformed.
std::vector<uint64_t> parseSizes(const std::string &text);

/// The progress display on stderr: a bar redrawn in place on a terminal, else one line per
/// finished step.
class Progress {
public:
    explicit Progress(size_t total_steps);
    ~Progress();
    /// Shows what is running now (a terminal only).
    void begin(const std::string &what);
    /// One step done; `line` is printed when stderr is not a terminal.
    void done(const std::string &line);
    /// Clears the bar (before other output).
    void clear();

private:
    void draw();
    size_t total_;
    size_t done_ = 0;
    bool tty_;
    std::string what_;
};

/// The table for people (stdout).
std::string formatTable(const RunInfo &info, const std::vector<SizeResult> &results);
/// One row per size, with a header line.
std::string formatCsv(const std::vector<SizeResult> &results);
/// The whole run as one JSON object.
std::string formatJson(const RunInfo &info, const std::vector<SizeResult> &results);
/// Writes `text` to `path` ("-" is stdout). Throws BenchError on failure.
void writeOutput(const std::string &path, const std::string &text);

}  // namespace tensorlane::tools::bench
