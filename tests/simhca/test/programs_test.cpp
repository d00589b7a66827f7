// Programs nobody here wrote, run unchanged on the simulated HCA: ibverbs-utils' ibv_devices,
// ibv_devinfo and ibv_rc_pingpong, perftest's ib_write_lat and ib_write_bw (with --tclass);
// and a capture of their traffic, decoded by tshark and checked by pcap_icrc_check.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "verbs_fixture.hpp"

namespace tensorlane::simhca::test {
namespace {

struct Result {
    int status;
    std::string out;
};

// Runs a bash script with the simulator's environment (inherited: LD_LIBRARY_PATH from CTest,
// TENSORLANE_SYSFS_ROOT from config()).
Result sh(const std::string &script) {
    char tmpl[] = "/tmp/simhca-prog-XXXXXX";
    const int fd = mkstemp(tmpl);
    close(fd);
    const std::string cmd = "bash -c '" + script + "' > " + tmpl + " 2>&1";
    const int rc = std::system(cmd.c_str());
    std::ifstream in(tmpl);
    std::stringstream ss;
    ss << in.rdbuf();
    std::remove(tmpl);
    return {WIFEXITED(rc) ? WEXITSTATUS(rc) : 128, ss.str()};
}

bool have(const char *program) {
    return sh(std::string("command -v ") + program).status == 0;
}

// A TCP port for the programs' own out-of-band exchange, unique to this test process.
std::string tcpPort(int k) {
    return std::to_string(20000 + (getpid() * 7 + k * 131) % 20000);
}

// Starts tcpdump on lo in the background ($td) and waits until it is capturing.
std::string startTcpdump(const std::string &dir, const std::string &pcap,
                         const std::string &filter) {
    return "tcpdump -i lo -s 0 -B 16384 -U --immediate-mode -w " + pcap + " \"" + filter +
           "\" 2> " + dir + "/td.log & td=$!; for i in $(seq 100); do grep -q listening " + dir +
           "/td.log && break; sleep 0.05; done; sleep 0.2; ";
}

#define REQUIRE_PROGRAM(p)                                                              \
    if (!have(p)) {                                                                     \
        GTEST_SKIP() << p << " is not installed (scripts/install-deps.sh installs it)"; \
    }

class Programs : public ::testing::Test {
protected:
    void SetUp() override {
        if (!config().simulator) {
            GTEST_SKIP() << "runs the programs on the simulator only";
        }
    }
};

TEST_F(Programs, IbvDevicesListsBothDevices) {
    REQUIRE_PROGRAM("ibv_devices");
    const Result r = sh("ibv_devices");
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find(config().dev_a), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(config().dev_b), std::string::npos) << r.out;
}

TEST_F(Programs, IbvDevinfoShowsThePort) {
    REQUIRE_PROGRAM("ibv_devinfo");
    const Result r = sh("ibv_devinfo -v -d " + config().dev_a);
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("PORT_ACTIVE"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("link_layer:\t\tEthernet"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("active_mtu:\t\t4096"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("GID[  3]:\t\t::ffff:" + config().ip_a + ", RoCE v2"), std::string::npos)
        << r.out;
}

TEST_F(Programs, IbvRcPingpongWithValidation) {
    REQUIRE_PROGRAM("ibv_rc_pingpong");
    const std::string port = tcpPort(1);
    const Result r = sh("ibv_rc_pingpong -d " + config().dev_a + " -g 3 -c -n 200 -s 8192 -p " +
                        port + " & srv=$!; sleep 0.3; timeout 30 ibv_rc_pingpong -d " +
                        config().dev_b + " -g 3 -c -n 200 -s 8192 -p " + port +
                        " 127.0.0.1; c=$?; wait $srv; s=$?; exit $((c | s))");
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("200 iters"), std::string::npos) << r.out;
}

TEST_F(Programs, IbvRcPingpongEventMode) {
    REQUIRE_PROGRAM("ibv_rc_pingpong");
    const std::string port = tcpPort(2);
    const Result r =
        sh("ibv_rc_pingpong -e -d " + config().dev_a + " -g 3 -n 200 -p " + port +
           " & srv=$!; sleep 0.3; timeout 30 ibv_rc_pingpong -e -d " + config().dev_b +
           " -g 3 -n 200 -p " + port + " 127.0.0.1; c=$?; wait $srv; s=$?; exit $((c | s))");
    ASSERT_EQ(r.status, 0) << r.out;
}

TEST_F(Programs, PerftestWriteLatency) {
    REQUIRE_PROGRAM("ib_write_lat");
    const std::string port = tcpPort(3);
    const Result r =
        sh("ib_write_lat -F -d " + config().dev_a + " -x 3 -n 1000 -s 64 -p " + port +
           " & srv=$!; sleep 0.4; timeout 60 ib_write_lat -F -d " + config().dev_b +
           " -x 3 -n 1000 -s 64 -p " + port + " 127.0.0.1; c=$?; wait $srv; s=$?; exit $((c | s))");
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("t_typical"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("inf "), std::string::npos) << r.out;
}

TEST_F(Programs, PerftestWriteBandwidthWithTclass) {
    REQUIRE_PROGRAM("ib_write_bw");
    const std::string port = tcpPort(4);
    // --tclass 106: DSCP 26 with ECT(0), as the project's default config derives.
    const Result r = sh(
        "ib_write_bw -F --tclass 106 -d " + config().dev_a + " -x 3 -n 200 -s 65536 -p " + port +
        " & srv=$!; sleep 0.4; timeout 60 ib_write_bw -F --tclass 106 -d " + config().dev_b +
        " -x 3 -n 200 -s 65536 -p " + port + " 127.0.0.1; c=$?; wait $srv; s=$?; exit $((c | s))");
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("BW average"), std::string::npos) << r.out;
}

// tcpdump on the loopback while ib_write_bw runs with --tclass 106 and ibv_rc_pingpong sends
// and receives; tshark must decode RoCE with the expected opcodes, DSCP 26 and ECN 2, and
// pcap_icrc_check must verify every ICRC.
TEST_F(Programs, CaptureDecodesAsRoceWithDscpEcnAndGoodIcrcs) {
    REQUIRE_PROGRAM("tcpdump");
    REQUIRE_PROGRAM("tshark");
    if (geteuid() != 0) {
        GTEST_SKIP() << "capturing on lo needs root (CAP_NET_RAW)";
    }
    const Config &c = config();
    char dir[] = "/tmp/simhca-cap-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    const std::string pcap = std::string(dir) + "/roce.pcap";
    const std::string port = tcpPort(5);
    const std::string port2 = tcpPort(6);
    const Result cap =
        sh(startTcpdump(dir, pcap, "udp port 4791 and host " + c.ip_a) +
           "ib_write_bw -F --tclass 106 -d " + c.dev_a + " -x 3 -n 20 -s 10000 -p " + port +
           " & srv=$!; sleep 0.4; timeout 60 ib_write_bw -F --tclass 106 -d " + c.dev_b +
           " -x 3 -n 20 -s 10000 -p " + port +
           " 127.0.0.1 >/dev/null; wait $srv; "
           "ibv_rc_pingpong -d " +
           c.dev_a + " -g 3 -n 5 -p " + port2 +
           " & srv=$!; sleep 0.3; timeout 30 ibv_rc_pingpong -d " + c.dev_b + " -g 3 -n 5 -p " +
           port2 +
           " 127.0.0.1; wait $srv; "
           "sleep 0.5; kill -INT $td; wait $td");
    ASSERT_EQ(cap.status, 0) << cap.out;
    const Result icrc = sh(std::string(SIMHCA_PCAP_ICRC_CHECK) + " " + pcap);
    EXPECT_EQ(icrc.status, 0) << icrc.out;
    EXPECT_NE(icrc.out.find(" 0 bad"), std::string::npos) << icrc.out;
    // tshark decodes UDP 4791 as RoCE (InfiniBand over UDP) by default.
    const Result ts = sh("tshark -r " + pcap +
                         " -T fields -e ip.dsfield.dscp -e ip.dsfield.ecn -e infiniband.bth.opcode"
                         " -e ip.ttl | sort | uniq -c");
    ASSERT_EQ(ts.status, 0) << ts.out;
    // ib_write_bw: RDMA WRITE FIRST/MIDDLE/LAST (6, 7, 8) with DSCP 26, ECN 2; ACKs (17) come
    // back with the same class (perftest sets --tclass on both sides).
    for (const char *want : {"26\t2\t6\t", "26\t2\t7\t", "26\t2\t8\t", "26\t2\t17\t"}) {
        EXPECT_NE(ts.out.find(want), std::string::npos) << "missing " << want << "\n" << ts.out;
    }
    // ibv_rc_pingpong: 4096-byte SENDs at its default MTU of 1024, so SEND FIRST/MIDDLE/LAST
    // (0, 1, 2), traffic class 0, and TTL 1: it sets the GRH hop limit to 1.
    for (const char *want : {"0\t0\t0\t1\n", "0\t0\t1\t1\n", "0\t0\t2\t1\n", "0\t0\t17\t1\n"}) {
        EXPECT_NE(ts.out.find(want), std::string::npos) << "missing " << want << "\n" << ts.out;
    }
    // perftest sets hop limit 255.
    EXPECT_NE(ts.out.find("26\t2\t6\t255\n"), std::string::npos) << ts.out;
    // UDP source ports come from the QP number: 0xc000 | hash (49152..65535), as rxe's.
    const Result ports = sh("tshark -r " + pcap + " -T fields -e udp.srcport | sort -n | head -1");
    EXPECT_GE(std::atoi(ports.out.substr(ports.out.rfind('\n', ports.out.size() - 2) + 1).c_str()),
              49152)
        << ports.out;
    const Result names = sh("tshark -r " + pcap + " -V | grep -m3 -E \"Opcode:|Invariant CRC\"");
    EXPECT_NE(names.out.find("Opcode"), std::string::npos) << names.out;
    std::cout << icrc.out << ts.out;
    sh(std::string("rm -rf ") + dir);
}

// A host-wide traffic class in tc/1/traffic_class (as MLNX_OFED's sysfs knob) replaces the
// GRH traffic class on the wire: ibv_rc_pingpong asks for 0 and DSCP 46 goes out.
TEST_F(Programs, HostWideTrafficClassOverridesTheGrh) {
    REQUIRE_PROGRAM("tcpdump");
    REQUIRE_PROGRAM("tshark");
    if (geteuid() != 0) {
        GTEST_SKIP() << "capturing on lo needs root (CAP_NET_RAW)";
    }
    const Config &c = config();
    const std::string tc = c.sysfs_root + "/class/infiniband/" + c.dev_b + "/tc/1";
    sh("mkdir -p " + tc + " && echo \"Global tclass=184\" > " + tc + "/traffic_class");
    char dir[] = "/tmp/simhca-tc-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    const std::string pcap = std::string(dir) + "/tc.pcap";
    const std::string port = tcpPort(7);
    const Result cap = sh(startTcpdump(dir, pcap, "udp port 4791 and src host " + c.ip_b) +
                          "ibv_rc_pingpong -d " + c.dev_a + " -g 3 -n 5 -p " + port +
                          " >/dev/null & srv=$!; sleep 0.3; timeout 30 ibv_rc_pingpong -d " +
                          c.dev_b + " -g 3 -n 5 -p " + port +
                          " 127.0.0.1 >/dev/null; wait $srv; sleep 0.5; kill -INT $td; wait $td");
    sh("rm -rf " + tc);
    ASSERT_EQ(cap.status, 0) << cap.out;
    const Result ts = sh("tshark -r " + pcap + " -T fields -e ip.dsfield.dscp | sort -u");
    EXPECT_EQ(ts.out.find("0\n"), std::string::npos) << ts.out;
    EXPECT_NE(ts.out.find("46\n"), std::string::npos) << ts.out;
    sh(std::string("rm -rf ") + dir);
}

}  // namespace
}  // namespace tensorlane::simhca::test
