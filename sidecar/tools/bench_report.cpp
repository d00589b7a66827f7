#include "bench_report.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <sstream>

#include "bench_env.hpp"

namespace tensorlane::tools::bench {

Latency Latency::of(std::vector<double> &samples) {
    Latency l;
    if (samples.empty()) {
        return l;
    }
    std::sort(samples.begin(), samples.end());
    auto at = [&](double q) {
        size_t i = static_cast<size_t>(std::lround(q * static_cast<double>(samples.size() - 1)));
        return samples[std::min(i, samples.size() - 1)];
    };
    l.iters = samples.size();
    l.p50_us = at(0.50);
    l.p99_us = at(0.99);
    l.min_us = samples.front();
    l.avg_us =
        std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(samples.size());
    return l;
}

Latency Latency::of(LatencySamples &samples) {
    Latency l = of(samples.rtt);
    auto median = [](std::vector<double> &v) {
        if (v.empty()) {
            return -1.0;
        }
        std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(v.size() / 2), v.end());
        return v[v.size() / 2];
    };
    l.a_to_b_p50_us = median(samples.a_to_b);
    l.b_turn_p50_us = median(samples.b_turn);
    l.b_to_a_p50_us = median(samples.b_to_a);
    return l;
}

std::optional<double> SizeResult::latRatio() const {
    if (!lat || !tcp_lat || tcp_lat->p50_us <= 0) {
        return std::nullopt;
    }
    return lat->p50_us / tcp_lat->p50_us;
}

std::optional<double> SizeResult::latMinRatio() const {
    if (!lat || !tcp_lat || tcp_lat->min_us <= 0) {
        return std::nullopt;
    }
    return lat->min_us / tcp_lat->min_us;
}

std::optional<double> SizeResult::bwRatio() const {
    if (!bw || !tcp_bw || tcp_bw->gbps() <= 0) {
        return std::nullopt;
    }
    return bw->gbps() / tcp_bw->gbps();
}

// ---- sizes ----

std::string formatBytes(uint64_t bytes) {
    static const char *kUnits[] = {"B", "KiB", "MiB", "GiB"};
    int u = 0;
    while (u < 3 && bytes >= 1024 && bytes % 1024 == 0) {
        bytes /= 1024;
        ++u;
    }
    return std::to_string(bytes) + " " + kUnits[u];
}

std::optional<uint64_t> parseBytes(const std::string &text) {
    size_t pos = 0;
    uint64_t v = 0;
    try {
        v = std::stoull(text, &pos);
    } catch (...) {
        return std::nullopt;
    }
    std::string unit = text.substr(pos);
    for (auto &ch : unit) {
        ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    }
    int shift = 0;
    if (unit.empty() || unit == "B") {
        shift = 0;
    } else if (unit == "K" || unit == "KB" || unit == "KIB") {
        shift = 10;
    } else if (unit == "M" || unit == "MB" || unit == "MIB") {
        shift = 20;
    } else if (unit == "G" || unit == "GB" || unit == "GIB") {
        shift = 30;
    } else {
        return std::nullopt;
    }
    if (v == 0 || v > (uint64_t{1} << (40 - shift))) {
        return std::nullopt;
    }
    return v << shift;
}

std::vector<uint64_t> parseSizes(const std::string &text) {
    std::set<uint64_t> out;
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ',')) {
        auto dash = item.find('-');
        if (dash == std::string::npos) {
            auto v = parseBytes(item);
            if (!v) {
                throw BenchError("--sizes: cannot read '" + item + "' (e.g. 64,4K,1M or 64-64M)");
            }
            out.insert(*v);
            continue;
        }
        auto lo = parseBytes(item.substr(0, dash));
        auto hi = parseBytes(item.substr(dash + 1));
        if (!lo || !hi || *lo > *hi) {
            throw BenchError("--sizes: cannot read the range '" + item + "' (e.g. 64-64M)");
        }
        for (uint64_t v = *lo; v <= *hi; v *= 4) {
            out.insert(v);
        }
    }
    if (out.empty()) {
        throw BenchError("--sizes: no sizes given");
    }
    return {out.begin(), out.end()};
}

// ---- progress ----

Progress::Progress(size_t total_steps) : total_(total_steps), tty_(::isatty(2) == 1) {}

Progress::~Progress() {
    clear();
}

void Progress::begin(const std::string &what) {
    what_ = what;
    if (tty_) {
        draw();
    }
}

void Progress::done(const std::string &line) {
    ++done_;
    if (tty_) {
        draw();
    } else {
        std::fprintf(stderr, "bench [%zu/%zu] %s\n", done_, total_, line.c_str());
        std::fflush(stderr);
    }
}

void Progress::clear() {
    if (tty_) {
        std::fprintf(stderr, "\r\033[K");
        std::fflush(stderr);
    }
}

void Progress::draw() {
    constexpr size_t kWidth = 30;
    size_t filled = total_ ? done_ * kWidth / total_ : kWidth;
    std::string bar(filled, '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r\033[K[%s] %3zu%% %s", bar.c_str(), total_ ? done_ * 100 / total_ : 100,
                 what_.c_str());
    std::fflush(stderr);
}

// ---- outputs ----

namespace {

std::string fmt(const char *f, double v) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), f, v);
    return buf;
}

std::string pad(const std::string &s, size_t w) {
    return s.size() >= w ? s : std::string(w - s.size(), ' ') + s;
}

}  // namespace

std::string formatTable(const RunInfo &info, const std::vector<SizeResult> &results) {
    std::ostringstream o;
    o << "tensorlane bench: " << info.local_node << " -> " << info.peer_node << " (" << info.mode;
    if (!info.transport.empty()) {
        o << ", " << info.transport << " transport";
        if (!info.devices.empty()) {
            o << " on " << info.devices;
        }
    }
    if (info.connections) {
        o << ", " << info.connections << " connection(s) per peer";
    }
    if (info.chunk_bytes) {
        o << ", " << formatBytes(info.chunk_bytes) << " chunks";
    }
    if (!info.poll_mode.empty()) {
        o << ", poll mode " << info.poll_mode;
    }
    if (info.spin_us >= 0) {
        o << ", spin " << info.spin_us << " us";
    }
    o << "), " << info.date << ", " << info.host << "\n";
    if (!info.poll_mode_reason.empty()) {
        o << "poll mode " << info.poll_mode << ": " << info.poll_mode_reason << "\n";
    }
    if (info.rounds > 1) {
        o << info.rounds << " rounds per size, alternating with the baseline\n";
    }

    bool any_lat = std::any_of(results.begin(), results.end(), [](auto &r) { return r.lat; });
    bool any_bw = std::any_of(results.begin(), results.end(), [](auto &r) { return r.bw; });
    if (any_lat) {
        o << "\nLatency: full round trip in us (A writes into B's region with an immediate; B "
             "is notified and writes the same bytes back; A is notified)\n";
        o << "baseline: plain TCP ping-pong of the same size between two processes; A->B, B "
             "turn, B->A: medians of the round trip's parts (worker to worker)\n";
        o << pad("size", 9) << pad("iters", 7) << pad("p50", 9) << pad("p99", 9) << pad("avg", 9)
          << " |" << pad("A->B", 8) << pad("B turn", 8) << pad("B->A", 8) << " |"
          << pad("tcp p50", 9) << pad("tcp p99", 9) << pad("tcp avg", 9) << " |"
          << pad("p50 ratio", 10) << pad("min ratio", 10) << "\n";
        auto part = [](double v) { return v >= 0 ? fmt("%.1f", v) : std::string("-"); };
        for (const auto &r : results) {
            if (!r.lat) {
                continue;
            }
            o << pad(formatBytes(r.bytes), 9) << pad(std::to_string(r.lat->iters), 7)
              << pad(fmt("%.1f", r.lat->p50_us), 9) << pad(fmt("%.1f", r.lat->p99_us), 9)
              << pad(fmt("%.1f", r.lat->avg_us), 9) << " |" << pad(part(r.lat->a_to_b_p50_us), 8)
              << pad(part(r.lat->b_turn_p50_us), 8) << pad(part(r.lat->b_to_a_p50_us), 8) << " |";
            if (r.tcp_lat) {
                o << pad(fmt("%.1f", r.tcp_lat->p50_us), 9)
                  << pad(fmt("%.1f", r.tcp_lat->p99_us), 9)
                  << pad(fmt("%.1f", r.tcp_lat->avg_us), 9);
            } else {
                o << pad("-", 9) << pad("-", 9) << pad("-", 9);
            }
            o << " |" << pad(r.latRatio() ? fmt("%.2fx", *r.latRatio()) : "-", 10)
              << pad(r.latMinRatio() ? fmt("%.2fx", *r.latMinRatio()) : "-", 10);
            if (r.bytes == kLatGoalBytes && r.latRatio()) {
                o << (*r.latRatio() <= kLatGoalRatio ? "  goal <=2x: ok" : "  goal <=2x: MISSED");
            }
            o << "\n";
        }
    }
    if (any_bw) {
        o << "\nBandwidth: GB/s (1e9 bytes/s) of completed writes, " << info.window
          << " in flight at most (fewer for big writes: 128 MiB in flight at most)\n";
        o << "baseline: one plain TCP stream (send loop -> recv loop) of the same message size\n";
        o << pad("size", 9) << pad("writes", 9) << pad("GB/s", 9) << " |" << pad("tcp GB/s", 10)
          << " |" << pad("ratio", 8) << "\n";
        for (const auto &r : results) {
            if (!r.bw) {
                continue;
            }
            o << pad(formatBytes(r.bytes), 9) << pad(std::to_string(r.bw->writes), 9)
              << pad(fmt("%.3f", r.bw->gbps()), 9) << " |"
              << pad(r.tcp_bw ? fmt("%.3f", r.tcp_bw->gbps()) : "-", 10) << " |"
              << pad(r.bwRatio() ? fmt("%.0f%%", 100 * *r.bwRatio()) : "-", 8);
            if (r.bytes >= kBwGoalMinBytes && r.bwRatio()) {
                o << (*r.bwRatio() >= kBwGoalRatio ? "  goal >=80%: ok" : "  goal >=80%: MISSED");
            }
            o << "\n";
        }
    }
    return o.str();
}

std::string formatCsv(const std::vector<SizeResult> &results) {
    std::ostringstream o;
    o << "bytes,lat_iters,lat_p50_us,lat_p99_us,lat_avg_us,lat_a_to_b_p50_us,lat_b_turn_p50_us,"
         "lat_b_to_a_p50_us,tcp_lat_p50_us,tcp_lat_p99_us,tcp_lat_avg_us,lat_p50_ratio,bw_writes,"
         "bw_gbps,tcp_bw_gbps,bw_ratio\n";
    auto num = [](std::optional<double> v, const char *f = "%.3f") {
        return v ? fmt(f, *v) : std::string();
    };
    auto part = [](const std::optional<Latency> &l, double Latency::*field) {
        return l && (*l).*field >= 0 ? std::optional((*l).*field) : std::nullopt;
    };
    for (const auto &r : results) {
        o << r.bytes << "," << (r.lat ? std::to_string(r.lat->iters) : "") << ","
          << num(r.lat ? std::optional(r.lat->p50_us) : std::nullopt) << ","
          << num(r.lat ? std::optional(r.lat->p99_us) : std::nullopt) << ","
          << num(r.lat ? std::optional(r.lat->avg_us) : std::nullopt) << ","
          << num(part(r.lat, &Latency::a_to_b_p50_us)) << ","
          << num(part(r.lat, &Latency::b_turn_p50_us)) << ","
          << num(part(r.lat, &Latency::b_to_a_p50_us)) << ","
          << num(r.tcp_lat ? std::optional(r.tcp_lat->p50_us) : std::nullopt) << ","
          << num(r.tcp_lat ? std::optional(r.tcp_lat->p99_us) : std::nullopt) << ","
          << num(r.tcp_lat ? std::optional(r.tcp_lat->avg_us) : std::nullopt) << ","
          << num(r.latRatio(), "%.4f") << "," << (r.bw ? std::to_string(r.bw->writes) : "") << ","
          << num(r.bw ? std::optional(r.bw->gbps()) : std::nullopt, "%.4f") << ","
          << num(r.tcp_bw ? std::optional(r.tcp_bw->gbps()) : std::nullopt, "%.4f") << ","
          << num(r.bwRatio(), "%.4f") << "\n";
    }
    return o.str();
}

std::string formatJson(const RunInfo &info, const std::vector<SizeResult> &results) {
    using nlohmann::json;
    auto lat = [](const Latency &l) {
        json j{{"iters", l.iters},
               {"p50_us", l.p50_us},
               {"p99_us", l.p99_us},
               {"avg_us", l.avg_us},
               {"min_us", l.min_us}};
        if (l.a_to_b_p50_us >= 0) {
            j["a_to_b_p50_us"] = l.a_to_b_p50_us;
            j["b_turn_p50_us"] = l.b_turn_p50_us;
            j["b_to_a_p50_us"] = l.b_to_a_p50_us;
        }
        return j;
    };
    auto bw = [](const Bandwidth &b) {
        return json{
            {"writes", b.writes}, {"bytes", b.bytes}, {"seconds", b.seconds}, {"gbps", b.gbps()}};
    };
    json rows = json::array();
    bool lat_goal_seen = false, lat_goal_ok = true, bw_goal_seen = false, bw_goal_ok = true;
    for (const auto &r : results) {
        json row{{"bytes", r.bytes}};
        if (r.lat) {
            row["latency"] = lat(*r.lat);
        }
        if (r.tcp_lat) {
            row["tcp_latency"] = lat(*r.tcp_lat);
        }
        if (auto x = r.latRatio()) {
            row["latency_p50_ratio"] = *x;
            if (auto m = r.latMinRatio()) {
                row["latency_min_ratio"] = *m;
            }
            if (r.bytes == kLatGoalBytes) {
                lat_goal_seen = true;
                lat_goal_ok = *x <= kLatGoalRatio;
            }
        }
        if (r.bw) {
            row["bandwidth"] = bw(*r.bw);
        }
        if (r.tcp_bw) {
            row["tcp_bandwidth"] = bw(*r.tcp_bw);
        }
        if (auto x = r.bwRatio()) {
            row["bandwidth_ratio"] = *x;
            if (r.bytes >= kBwGoalMinBytes) {
                bw_goal_seen = true;
                bw_goal_ok = bw_goal_ok && *x >= kBwGoalRatio;
            }
        }
        rows.push_back(row);
    }
    json j{{"date", info.date},
           {"host", info.host},
           {"mode", info.mode},
           {"local_node", info.local_node},
           {"peer_node", info.peer_node},
           {"latency_is", "full round trip"},
           {"window", info.window},
           {"iters", info.iters},
           {"duration_s", info.duration_s},
           {"rounds", info.rounds},
           {"results", rows}};
    if (!info.transport.empty()) {
        j["transport"] = info.transport;
    }
    if (!info.devices.empty()) {
        j["devices"] = info.devices;
    }
    if (info.connections) {
        j["tcp_connections_per_peer"] = info.connections;
    }
    if (info.chunk_bytes) {
        j["tcp_chunk_bytes"] = info.chunk_bytes;
    }
    if (!info.poll_mode.empty()) {
        j["poll_mode"] = info.poll_mode;
        j["poll_mode_reason"] = info.poll_mode_reason;
    }
    if (info.spin_us >= 0) {
        j["spin_us"] = info.spin_us;
    }
    json goals = json::object();
    if (lat_goal_seen) {
        goals["latency_64B_at_most_2x_tcp"] = lat_goal_ok;
    }
    if (bw_goal_seen) {
        goals["bandwidth_4MiB_up_at_least_80pct_tcp"] = bw_goal_ok;
    }
    j["goals_met"] = goals;
    return j.dump(2) + "\n";
}

void writeOutput(const std::string &path, const std::string &text) {
    if (path == "-") {
        std::cout << text << std::flush;
        return;
    }
    std::ofstream out(path);
    out << text;
    out.flush();
    if (!out) {
        throw BenchError("cannot write " + path);
    }
}

}  // namespace tensorlane::tools::bench
