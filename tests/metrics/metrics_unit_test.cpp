// The metrics endpoint's parts without a sidecar: the engine's write counters, the snapshot
// hand-over between threads, the NIC counters read from a fixture sysfs tree, and the families
// built from a known snapshot, checked by Debian's promtool.
#include <gtest/gtest.h>
#include <poll.h>
#include <prometheus/text_serializer.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <thread>

#include "../fabric/sysfs_tree.hpp"
#include "../fabric/test_config.hpp"
#include "metrics/families.hpp"
#include "metrics/nic_counters.hpp"
#include "metrics/snapshot.hpp"
#include "metrics/write_clock.hpp"
#include "metrics/write_stats.hpp"

namespace tensorlane::sidecar {
namespace {

using ipc::Code;

TEST(EngineStats, CountsWritesByPeerAndStatus) {
    EngineStats s({"node-a", "node-b", "node-c"});
    s.setTiming(true);
    s.writeEnded(1, Code::kOk, 4096, 30'000);
    s.writeEnded(1, Code::kOk, 100, 30'000);
    s.writeEnded(1, Code::kPeer, 1 << 20, 5'000'000'000);
    s.writeEnded(2, Code::kTimedOut, 10, 1);
    s.writeEnded(7, Code::kOk, 10, 1);  // not a peer: ignored, not a crash
    const WriteStats &b = s.peers()[1];
    EXPECT_EQ(b.writes, 3u);
    EXPECT_EQ(b.bytes, 4196u);  // failed writes moved no bytes that count
    EXPECT_EQ(b.by_status[static_cast<size_t>(Code::kOk)], 2u);
    EXPECT_EQ(b.by_status[static_cast<size_t>(Code::kPeer)], 1u);
    EXPECT_EQ(b.timed(), 2u);  // completed writes only
    EXPECT_EQ(b.latency_sum_ns, 60'000u);
    EXPECT_EQ(s.peers()[2].by_status[static_cast<size_t>(Code::kTimedOut)], 1u);
    EXPECT_EQ(s.peers()[2].timed(), 0u);
    EXPECT_EQ(s.peers()[0].writes, 0u);
}

TEST(EngineStats, LatencyBucketsAreUpperBoundsInclusive) {
    EngineStats s({"a"});
    s.setTiming(true);
    s.writeEnded(0, Code::kOk, 1, 1'000);           // exactly 1 us: the first bucket (le 1e-06)
    s.writeEnded(0, Code::kOk, 1, 1'001);           // just above: the second (le 2.5e-06)
    s.writeEnded(0, Code::kOk, 1, 20'000'000'000);  // 20 s: +Inf
    const auto &b = s.peers()[0].latency_buckets;
    EXPECT_EQ(b[0], 1u);
    EXPECT_EQ(b[1], 1u);
    EXPECT_EQ(b.back(), 1u);
}

TEST(EngineStats, NoTimingNoHistogram) {
    EngineStats s({"a"});
    s.writeEnded(0, Code::kOk, 64, 123);
    EXPECT_EQ(s.peers()[0].bytes, 64u);
    EXPECT_EQ(s.peers()[0].timed(), 0u);
}

TEST(EngineStats, OneClockReadPerBatch) {
    EngineStats s({"a"});
    const int64_t first = s.now();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    EXPECT_EQ(s.now(), first);  // the same batch: the cached reading
    s.invalidateClock();
    EXPECT_GE(s.now() - first, 2'000'000);  // a new batch reads the clock again
}

size_t lowerBoundBucket(uint64_t ns) {
    return static_cast<size_t>(
        std::lower_bound(kLatencyBoundsNs.begin(), kLatencyBoundsNs.end(), ns) -
        kLatencyBoundsNs.begin());
}

TEST(EngineStats, LatencyBucketIsTheFirstBoundAtOrAbove) {
    // latencyBucket() (count-leading-zeros and one compare) against std::lower_bound: every
    // bound and its neighbours, every power of two and its neighbours, and random values of
    // every magnitude.
    std::vector<uint64_t> values = {0, UINT64_MAX, UINT64_MAX - 1};
    for (uint64_t b : kLatencyBoundsNs) {
        values.insert(values.end(), {b - 1, b, b + 1, b / 2, b * 2});
    }
    for (int w = 0; w < 64; ++w) {
        const uint64_t p = uint64_t{1} << w;
        values.insert(values.end(), {p - 1, p, p + 1});
    }
    std::mt19937_64 rng(20);
    for (int i = 0; i < 200'000; ++i) {
        values.push_back(rng() >> (rng() % 64));
    }
    for (uint64_t v : values) {
        ASSERT_EQ(latencyBucket(v), lowerBoundBucket(v)) << v << " ns";
    }
}

TEST(EngineStats, EndedWritesAreTimedOnceTheTurnEnds) {
    EngineStats s({"node-a", "node-b"});
    s.setClock(WriteClock{});  // the steady clock, to compare with
    s.setTiming(true);
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t accepted = s.now();
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    s.writeEndedSince(1, Code::kOk, 64, accepted);
    s.writeEndedSince(1, Code::kPeer, 64, accepted);  // failed: counted, never timed
    s.writeEndedSince(1, Code::kOk, 32, 0);           // accepted untimed: not timed either
    s.writeEndedSince(9, Code::kOk, 32, accepted);    // not a peer: ignored
    // Counted at once; the latency waits for the turn's end stamp.
    EXPECT_EQ(s.peers()[1].writes, 3u);
    EXPECT_EQ(s.peers()[1].bytes, 96u);
    EXPECT_EQ(s.peers()[1].timed(), 0u);
    EXPECT_EQ(s.endedUntimed(), 1u);
    s.timeEnded();
    const auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_EQ(s.endedUntimed(), 0u);
    EXPECT_EQ(s.peers()[1].timed(), 1u);
    EXPECT_GE(s.peers()[1].latency_sum_ns, 3'000'000u);
    EXPECT_LE(s.peers()[1].latency_sum_ns,
              static_cast<uint64_t>(std::chrono::nanoseconds(took).count()));
    s.timeEnded();  // nothing ended since: nothing more
    EXPECT_EQ(s.peers()[1].timed(), 1u);
}

TEST(EngineStats, AnEndStampBeforeTheAcceptanceCountsAsZero) {
    EngineStats s({"a"});
    s.setClock(WriteClock{});
    s.setTiming(true);
    s.writeEndedSince(0, Code::kOk, 1, s.now() + 1'000'000'000);  // another CPU's counter ahead
    s.timeEnded();
    EXPECT_EQ(s.peers()[0].latency_buckets[0], 1u);
    EXPECT_EQ(s.peers()[0].latency_sum_ns, 0u);
}

TEST(EngineStats, NoTimingNothingWaitsForAnEndStamp) {
    EngineStats s({"a"});
    s.writeEndedSince(0, Code::kOk, 64, 12345);
    EXPECT_EQ(s.endedUntimed(), 0u);
    s.timeEnded();
    EXPECT_EQ(s.peers()[0].bytes, 64u);
    EXPECT_EQ(s.peers()[0].timed(), 0u);
}

TEST(WriteClock, ChoosesTheTscExactlyWhereItIsUsable) {
    const WriteClock c = WriteClock::calibrated();
    EXPECT_EQ(c.usesTsc(), WriteClock::tscUsable()) << "calibration refused the TSC";
    if (c.usesTsc()) {
        EXPECT_GT(c.ticksPerNs(), 0.2);
        EXPECT_LT(c.ticksPerNs(), 20.0);
        EXPECT_STREQ(c.name(), "tsc");
    } else {
        EXPECT_EQ(c.ticksPerNs(), 0.0);
        EXPECT_STREQ(c.name(), "steady_clock");
    }
    EXPECT_FALSE(WriteClock{}.usesTsc());
}

TEST(WriteClock, MeasuresWhatTheSteadyClockMeasures) {
    // An interval on the chosen clock (the TSC here if usable) must lie between the steady
    // clock's inner and outer brackets of it, give or take 0.1% (the calibration's error is
    // about 1e-5): preemption anywhere widens the outer bracket, never breaks the check.
    const WriteClock c = WriteClock::calibrated();
    for (int round = 0; round < 3; ++round) {
        const int64_t s0 = monotonicNs();
        const int64_t w0 = c.nowNs();
        const int64_t s1 = monotonicNs();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        const int64_t s2 = monotonicNs();
        const int64_t w1 = c.nowNs();
        const int64_t s3 = monotonicNs();
        const double measured = static_cast<double>(w1 - w0);
        EXPECT_NE(w0, 0);
        EXPECT_GE(measured, static_cast<double>(s2 - s1) * 0.999) << c.name();
        EXPECT_LE(measured, static_cast<double>(s3 - s0) * 1.001) << c.name();
    }
}

TEST(EngineStats, ReceivedByPeerName) {
    EngineStats s({"node-a", "node-b"});
    s.received("node-b", 100);
    s.received("node-b", 28);
    s.received("stranger", 5);  // not configured: not counted
    EXPECT_EQ(s.peers()[1].received_writes, 2u);
    EXPECT_EQ(s.peers()[1].received_bytes, 128u);
    EXPECT_EQ(s.peers()[0].received_writes, 0u);
    // Runs from one peer, then another, then the first again (the last one's peer is tried
    // first; a different name still finds its own).
    s.received("node-a", 1);
    s.received("node-a", 2);
    s.received("node-b", 4);
    s.received("stranger", 8);
    s.received("node-b", 16);
    s.received(std::string_view("node-bb", 6), 32);  // a view into a longer buffer
    EXPECT_EQ(s.peers()[0].received_writes, 2u);
    EXPECT_EQ(s.peers()[0].received_bytes, 3u);
    EXPECT_EQ(s.peers()[1].received_writes, 5u);
    EXPECT_EQ(s.peers()[1].received_bytes, 180u);
}

TEST(SnapshotChannel, RequestTimesOutWhenNobodyServes) {
    Status st;
    auto ch = SnapshotChannel::create(&st);
    ASSERT_TRUE(ch) << st.message();
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(ch->request(std::chrono::milliseconds(50)), nullptr);
    EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(50));
}

TEST(SnapshotChannel, ServeAnswersTheWaitingRequests) {
    Status st;
    auto ch = SnapshotChannel::create(&st);
    ASSERT_TRUE(ch);
    std::atomic<int> answered{0};
    std::vector<std::thread> scrapers;
    for (int i = 0; i < 3; ++i) {
        scrapers.emplace_back([&] {
            auto snap = ch->request(std::chrono::seconds(5));
            if (snap && snap->report.node == "x") {
                ++answered;
            }
        });
    }
    // The engine side: serve whenever the eventfd says someone waits, as the loop does.
    int builds = 0;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (answered < 3 && std::chrono::steady_clock::now() < end) {
        pollfd p{ch->fd(), POLLIN, 0};
        if (::poll(&p, 1, 10) > 0) {
            ch->serve([&] {
                ++builds;
                Snapshot s;
                s.report.node = "x";
                return s;
            });
        }
    }
    for (auto &t : scrapers) {
        t.join();
    }
    EXPECT_EQ(answered, 3);
    EXPECT_GE(builds, 1);
    EXPECT_LE(builds, 3);
}

TEST(SnapshotChannel, CloseWakesWaitersAndRefusesLaterRequests) {
    Status st;
    auto ch = SnapshotChannel::create(&st);
    ASSERT_TRUE(ch);
    std::shared_ptr<const Snapshot> got = std::make_shared<const Snapshot>();
    const auto t0 = std::chrono::steady_clock::now();
    std::thread waiter([&] { got = ch->request(std::chrono::seconds(10)); });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ch->close();
    waiter.join();
    EXPECT_EQ(got, nullptr);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
    EXPECT_EQ(ch->request(std::chrono::seconds(10)), nullptr);  // at once, not after 10 s
}

TEST(NicCounters, TheSelectedPortsCountersOnly) {
    testing::SysfsTree t;
    t.standardHost();
    t.setCounter("mlx5_0", 1, "np_cnp_sent", 42);
    t.setCounter("mlx5_0", 1, "out_of_sequence", 18446744073709551615ull);
    t.setCounter("mlx5_0", 1, "lifespan", 10);  // a setting, not a count
    t.write(testing::SysfsTree::portDir("mlx5_0", 1) + "/hw_counters/garbage", "12abc");
    t.write(testing::SysfsTree::portDir("mlx5_0", 1) + "/hw_counters/negative", "-1");
    t.unreadable(testing::SysfsTree::portDir("mlx5_0", 1) + "/hw_counters/locked");
    // A second device that the config does not select.
    t.addDevice("mlx5_1", "devices/pci0000:00/0000:00:02.0");
    t.addPort("mlx5_1", 1, "1: DOWN");
    t.setCounter("mlx5_1", 1, "np_cnp_sent", 7);
    const auto cfg = testing::fabricConfig("device = \"mlx5_0\"\nnetdev = \"eth0\"");
    const auto nic = readNicCounters(cfg, SysfsRoot(t.rootString()));
    ASSERT_EQ(nic.size(), 1u);
    EXPECT_EQ(nic[0].device, "mlx5_0");
    EXPECT_EQ(nic[0].port, 1u);
    EXPECT_TRUE(nic[0].active);
    std::map<std::string, uint64_t> c(nic[0].counters.begin(), nic[0].counters.end());
    EXPECT_EQ(c.at("np_cnp_sent"), 42u);
    EXPECT_EQ(c.at("out_of_sequence"), 18446744073709551615ull);
    EXPECT_EQ(c.at("packet_seq_err"), 0u);
    EXPECT_EQ(c.count("lifespan"), 0u);
    EXPECT_EQ(c.count("garbage"), 0u);
    EXPECT_EQ(c.count("negative"), 0u);
    EXPECT_EQ(c.count("locked"), 0u);
}

TEST(NicCounters, EveryPortWhenNothingIsSelected) {
    testing::SysfsTree t;
    t.standardHost();
    t.addDevice("mlx5_1", "devices/pci0000:00/0000:00:02.0");
    t.addPort("mlx5_1", 1, "1: DOWN");
    t.setCounter("mlx5_1", 1, "np_cnp_sent", 7);
    // device = "auto" with two devices and no netdev: selection fails (ambiguous)... unless only
    // one is ACTIVE; name a device that is not there to make it fail for sure.
    const auto cfg = testing::fabricConfig("device = \"mlx9_9\"");
    const auto nic = readNicCounters(cfg, SysfsRoot(t.rootString()));
    ASSERT_EQ(nic.size(), 2u);
    EXPECT_EQ(nic[0].device, "mlx5_0");
    EXPECT_TRUE(nic[0].active);
    EXPECT_EQ(nic[1].device, "mlx5_1");
    EXPECT_FALSE(nic[1].active);
    ASSERT_EQ(nic[1].counters.size(), 1u);
    EXPECT_EQ(nic[1].counters[0].second, 7u);
}

TEST(NicCounters, NoDevicesNoPorts) {
    testing::SysfsTree t;
    EXPECT_TRUE(readNicCounters(testing::fabricConfig(""), SysfsRoot(t.rootString())).empty());
}

/// A snapshot like the engine's, with two peers (verbs and tcp).
Snapshot sampleSnapshot() {
    Snapshot s;
    s.timing = true;
    EngineReport &r = s.report;
    r.node = "node-a";
    r.socket = "/run/x.sock";
    r.poll_mode = "adaptive";
    r.uptime_s = 12.5;
    r.clients.resize(2);
    r.clients[0].session = 1;
    r.clients[0].pid = 10;
    r.clients[0].host_bytes = 4096;
    r.clients[0].in_flight = 2;
    r.clients[1].session = 2;
    r.clients[1].pid = 11;
    r.clients[1].host_bytes = 1024;
    r.regions = 3;
    r.registered_bytes = 5120;
    r.limits.mappings = 4;
    r.limits.max_mappings = 61434;
    r.counters.sessions_accepted = 2;
    r.counters.sessions_refused = 1;
    r.counters.notifications = 9;
    r.counters.writes_queued = 1;
    r.counters.writes_in_flight = 2;
    PeerReport &b = r.peers.emplace_back();
    b.name = "node-b";
    b.address = "10.0.0.2:18515";
    b.state = "up";
    b.failures = 1;
    b.control_connections = 2;
    b.remote_regions = 1;
    b.transport.transport = "verbs";
    b.transport.device_async_events = 3;
    b.transport.revocations_forced = 2;
    b.transport.send_qps = {{0x11, "RTS"}, {0x12, "ERR"}};
    b.transport.work_requests = 77;
    b.transport.completion_errors = 1;
    b.transport.receive_qps = {{0x21, "RTR"}};
    PeerReport &c = r.peers.emplace_back();
    c.name = "node-c";
    c.address = "10.0.0.3:18515";
    c.state = "connecting";
    c.transport.transport = "tcp";
    c.transport.data_connections = 2;
    s.peers.resize(3);
    s.peers[0].name = "node-a";
    s.peers[0].local = true;
    s.peers[1].name = "node-b";
    s.peers[2].name = "node-c";
    EngineStats es({"node-a", "node-b", "node-c"});
    es.setTiming(true);
    es.writeEnded(1, Code::kOk, 1000, 40'000);
    es.writeEnded(1, Code::kOk, 24, 3'000'000);
    es.writeEnded(1, Code::kPeer, 5, 0);
    es.received("node-b", 77);
    for (size_t i = 0; i < 3; ++i) {
        s.peers[i].stats = es.peers()[i];
    }
    s.peers[1].in_flight = 2;
    s.peers[1].queued = 1;
    s.rejected[static_cast<size_t>(Code::kInvalid)] = 4;
    return s;
}

std::vector<NicPortSample> sampleNic() {
    NicPortSample p;
    p.device = "mlx5_0";
    p.port = 1;
    p.active = true;
    p.counters = {{"np_cnp_sent", 5}, {"out_of_sequence", 2}};
    return {p};
}

/// Sample values by "name{label=value,...}" (labels in the family's order).
std::map<std::string, double> samples(const std::vector<prometheus::MetricFamily> &fams) {
    std::map<std::string, double> out;
    for (const auto &f : fams) {
        for (const auto &m : f.metric) {
            std::string key = f.name;
            std::string labels;
            for (const auto &l : m.label) {
                labels += (labels.empty() ? "" : ",") + l.name + "=" + l.value;
            }
            if (!labels.empty()) {
                key += "{" + labels + "}";
            }
            switch (f.type) {
                case prometheus::MetricType::Counter:
                    out[key] = m.counter.value;
                    break;
                case prometheus::MetricType::Gauge:
                    out[key] = m.gauge.value;
                    break;
                case prometheus::MetricType::Histogram:
                    out[key + "_count"] = static_cast<double>(m.histogram.sample_count);
                    out[key + "_sum"] = m.histogram.sample_sum;
                    break;
                default:
                    break;
            }
        }
    }
    return out;
}

TEST(MetricFamilies, FromASnapshot) {
    const Snapshot snap = sampleSnapshot();
    const auto v = samples(buildFamilies(&snap, sampleNic()));
    EXPECT_EQ(v.at("tensorlane_engine_up"), 1);
    EXPECT_EQ(v.at("tensorlane_clients"), 2);
    EXPECT_EQ(v.at("tensorlane_regions"), 3);
    EXPECT_EQ(v.at("tensorlane_registered_bytes"), 5120);
    EXPECT_EQ(v.at("tensorlane_host_buffer_bytes"), 5120);
    EXPECT_EQ(v.at("tensorlane_sessions_refused_total"), 1);
    EXPECT_EQ(v.at("tensorlane_requests_rejected_total{status=TL_EINVAL}"), 4);
    EXPECT_EQ(v.at("tensorlane_peer_writes_total{peer=node-b}"), 3);
    EXPECT_EQ(v.at("tensorlane_peer_write_bytes_total{peer=node-b}"), 1024);
    EXPECT_EQ(v.at("tensorlane_peer_write_errors_total{peer=node-b,status=TL_EPEER}"), 1);
    EXPECT_EQ(v.at("tensorlane_peer_write_errors_total{peer=node-b,status=TL_ETIMEDOUT}"), 0);
    EXPECT_EQ(v.count("tensorlane_peer_write_errors_total{peer=node-b,status=TL_OK}"), 0u);
    EXPECT_EQ(v.at("tensorlane_peer_write_latency_seconds{peer=node-b}_count"), 2);
    EXPECT_DOUBLE_EQ(v.at("tensorlane_peer_write_latency_seconds{peer=node-b}_sum"), 0.00304);
    EXPECT_EQ(v.at("tensorlane_peer_writes_in_flight{peer=node-b}"), 2);
    EXPECT_EQ(v.at("tensorlane_peer_writes_queued{peer=node-b}"), 1);
    EXPECT_EQ(v.at("tensorlane_peer_received_bytes_total{peer=node-b}"), 77);
    EXPECT_EQ(v.at("tensorlane_peer_writes_total{peer=node-a}"), 0);  // this node: local
    EXPECT_EQ(v.at("tensorlane_peer_state{peer=node-b,state=up}"), 1);
    EXPECT_EQ(v.at("tensorlane_peer_state{peer=node-b,state=failed}"), 0);
    EXPECT_EQ(v.at("tensorlane_peer_state{peer=node-c,state=connecting}"), 1);
    EXPECT_EQ(v.at("tensorlane_peer_info{peer=node-b,address=10.0.0.2:18515,transport=verbs}"), 1);
    EXPECT_EQ(v.at("tensorlane_peer_qps{peer=node-b,direction=send,state=RTS}"), 1);
    EXPECT_EQ(v.at("tensorlane_peer_qps{peer=node-b,direction=send,state=ERR}"), 1);
    EXPECT_EQ(v.at("tensorlane_peer_qps{peer=node-b,direction=send,state=INIT}"), 0);
    EXPECT_EQ(v.at("tensorlane_peer_qps{peer=node-b,direction=receive,state=RTR}"), 1);
    EXPECT_EQ(v.at("tensorlane_peer_verbs_work_requests_total{peer=node-b}"), 77);
    EXPECT_EQ(v.at("tensorlane_verbs_async_events_total"), 3);
    EXPECT_EQ(v.at("tensorlane_peer_verbs_revocations_forced_total{peer=node-b}"), 2);
    EXPECT_EQ(v.at("tensorlane_peer_tcp_data_connections{peer=node-c}"), 2);
    EXPECT_EQ(v.count("tensorlane_peer_qps{peer=node-c,direction=send,state=RTS}"), 0u);
    EXPECT_EQ(v.at("tensorlane_rdma_port_active{device=mlx5_0,port=1}"), 1);
    EXPECT_EQ(v.at("tensorlane_rdma_hw_counters_total{device=mlx5_0,port=1,counter=np_cnp_sent}"),
              5);
}

TEST(MetricFamilies, EngineSilentOrEmptyReport) {
    auto v = samples(buildFamilies(nullptr, sampleNic()));
    EXPECT_EQ(v.at("tensorlane_engine_up"), 0);
    EXPECT_EQ(v.count("tensorlane_clients"), 0u);
    EXPECT_EQ(v.count("tensorlane_rdma_port_active{device=mlx5_0,port=1}"), 1u);
    // An engine with nothing yet: its families with zeros, no peer families; a peer without a
    // name (never configured so) is left out rather than labelled "".
    Snapshot s;
    s.report.peers.emplace_back().transport.transport = "verbs";
    v = samples(buildFamilies(&s, {}));
    EXPECT_EQ(v.at("tensorlane_engine_up"), 1);
    EXPECT_EQ(v.at("tensorlane_clients"), 0);
    EXPECT_EQ(v.at("tensorlane_writes_in_flight"), 0);
    EXPECT_EQ(v.count("tensorlane_peer_info{peer=,address=,transport=verbs}"), 0u);
    EXPECT_EQ(v.count("tensorlane_verbs_async_events_total"), 0u);
}

/// Runs promtool on `text`; its exit status and what it said.
std::pair<int, std::string> promtool(const std::string &text) {
    char path[] = "/tmp/tl-metrics-XXXXXX";
    const int fd = ::mkstemp(path);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    ::close(fd);
    const std::string cmd = std::string("promtool check metrics < ") + path + " 2>&1";
    FILE *p = ::popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    size_t n = 0;
    while (p != nullptr && (n = std::fread(buf, 1, sizeof buf, p)) > 0) {
        out.append(buf, n);
    }
    const int status = p != nullptr ? ::pclose(p) : -1;
    ::unlink(path);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

bool havePromtool() {
    return std::system("command -v promtool >/dev/null 2>&1") == 0;
}

TEST(MetricFamilies, PromtoolAcceptsTheExposition) {
    if (!havePromtool()) {
        GTEST_SKIP() << "promtool is not installed (Debian package prometheus; "
                        "scripts/install-deps.sh installs it)";
    }
    const Snapshot snap = sampleSnapshot();
    const std::string text =
        prometheus::TextSerializer().Serialize(buildFamilies(&snap, sampleNic()));
    const auto [rc, out] = promtool(text);
    EXPECT_EQ(rc, 0) << out << "\n" << text;
    // And promtool is not a rubber stamp: a counter without _total is refused.
    const auto [bad_rc, bad_out] = promtool("# HELP x a\n# TYPE x counter\nx 1\n");
    EXPECT_NE(bad_rc, 0) << bad_out;
}

}  // namespace
}  // namespace tensorlane::sidecar
