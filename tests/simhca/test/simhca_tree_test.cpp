// What only the simulator can be asked: behaviour driven by the sysfs tree (active MTU, port
// state and GID changes as async events, hw_counters written back), what happens when its UDP
// port is taken, garbage on UDP 4791, and dma-buf registration of an mmap-able fd.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/udmabuf.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "headers.hpp"
#include "icrc.hpp"
#include "opcode.hpp"
#include "verbs_fixture.hpp"

namespace tensorlane::simhca::test {
namespace {

#define SKIP_UNLESS_SIMULATOR()                                                \
    if (!config().simulator) {                                                 \
        GTEST_SKIP() << "simulator-only test (SIMHCA_CONFORMANCE_DEVICE set)"; \
    }

void writeFile(const std::string &path, const std::string &text) {
    std::ofstream(path) << text << "\n";
}

std::string portDir(const std::string &dev) {
    return config().sysfs_root + "/class/infiniband/" + dev + "/ports/1";
}

TEST(SimTree, ActiveMtuFollowsTheNetdevMtu) {
    SKIP_UNLESS_SIMULATOR();
    char tmpl[] = "/tmp/simhca-mtu-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    const struct {
        int netdev_mtu;
        ibv_mtu active;
    } cases[] = {{1500, IBV_MTU_1024}, {2200, IBV_MTU_2048}, {4200, IBV_MTU_4096},
                 {9000, IBV_MTU_4096}, {1120, IBV_MTU_1024}, {1100, IBV_MTU_512},
                 {600, IBV_MTU_256}};
    int i = 0;
    for (const auto &c : cases) {
        runMksysfs(tmpl, "--dev mtu" + std::to_string(i) + " --netdev mtueth" + std::to_string(i) +
                             " --ip 127.99.0." + std::to_string(i + 1) + " --mtu " +
                             std::to_string(c.netdev_mtu));
        ++i;
    }
    // A second tree read by this process: the simulator reads the root at each device scan.
    const std::string saved = config().sysfs_root;
    setenv("TENSORLANE_SYSFS_ROOT", tmpl, 1);
    i = 0;
    for (const auto &c : cases) {
        ibv_context *ctx = openDevice("mtu" + std::to_string(i++));
        ASSERT_NE(ctx, nullptr);
        ibv_port_attr port{};
        ASSERT_EQ(ibv_query_port(ctx, 1, &port), 0);
        EXPECT_EQ(port.active_mtu, c.active) << "netdev mtu " << c.netdev_mtu;
        EXPECT_EQ(port.max_mtu, IBV_MTU_4096);
        ibv_close_device(ctx);
    }
    setenv("TENSORLANE_SYSFS_ROOT", saved.c_str(), 1);
}

TEST(SimTree, PortStateChangesRaisePortEvents) {
    SKIP_UNLESS_SIMULATOR();
    const Config &c = config();
    ibv_context *ctx = openDevice(c.dev_a);
    ASSERT_NE(ctx, nullptr);
    writeFile(portDir(c.dev_a) + "/state", "1: DOWN");
    ibv_async_event ev{};
    ASSERT_TRUE(getAsyncEvent(ctx, &ev));
    EXPECT_EQ(ev.event_type, IBV_EVENT_PORT_ERR);
    EXPECT_EQ(ev.element.port_num, 1);
    ibv_ack_async_event(&ev);
    ibv_port_attr port{};
    ASSERT_EQ(ibv_query_port(ctx, 1, &port), 0);
    EXPECT_EQ(port.state, IBV_PORT_DOWN);
    writeFile(portDir(c.dev_a) + "/state", "4: ACTIVE");
    ASSERT_TRUE(getAsyncEvent(ctx, &ev));
    EXPECT_EQ(ev.event_type, IBV_EVENT_PORT_ACTIVE);
    ibv_ack_async_event(&ev);
    ibv_close_device(ctx);
}

TEST(SimTree, GidChangesRaiseGidChange) {
    SKIP_UNLESS_SIMULATOR();
    const Config &c = config();
    ibv_context *ctx = openDevice(c.dev_a);
    ASSERT_NE(ctx, nullptr);
    const std::string gid5 = portDir(c.dev_a) + "/gids/5";
    writeFile(portDir(c.dev_a) + "/gid_attrs/types/5", "RoCE v2");
    writeFile(gid5, "0000:0000:0000:0000:0000:ffff:7f63:6363");
    ibv_async_event ev{};
    ASSERT_TRUE(getAsyncEvent(ctx, &ev));
    EXPECT_EQ(ev.event_type, IBV_EVENT_GID_CHANGE);
    ibv_ack_async_event(&ev);
    ibv_gid gid{};
    ASSERT_EQ(ibv_query_gid(ctx, 1, 5, &gid), 0);
    EXPECT_EQ(gid.raw[15], 0x63);
    writeFile(gid5, "0000:0000:0000:0000:0000:0000:0000:0000");
    std::remove((portDir(c.dev_a) + "/gid_attrs/types/5").c_str());
    while (getAsyncEvent(ctx, &ev, 300)) {
        ibv_ack_async_event(&ev);
    }
    ibv_close_device(ctx);
}

TEST(SimTree, CountersAreWrittenToTheTree) {
    SKIP_UNLESS_SIMULATOR();
    QpPair pair;
    auto src = pair.buffer(pair.a, 64);
    auto dst = pair.buffer(pair.b, 64);
    const long long before = hwCounter(pair.b.dev, "rx_write_requests");
    ASSERT_EQ(postSend(pair.a.qp, IBV_WR_RDMA_WRITE, *src, 0, 64, dst->addr(), dst->mr->rkey, 1),
              0);
    ibv_wc wc{};
    ASSERT_TRUE(pollOne(pair.a.cq, &wc));
    EXPECT_GE(waitCounter(pair.b.dev, "rx_write_requests", before + 1), before + 1);
}

// ACK coalescing (IB spec 9.7.5.1.2: one ACK may acknowledge many requests): a 64-packet
// WRITE asks for an ACK every 32 packets and at its end, and the responder answers once per
// receive batch, so far fewer ACKs than packets come back.
TEST(SimTree, AcksAreCoalesced) {
    SKIP_UNLESS_SIMULATOR();
    QpPair pair;
    const size_t n = 64 * 4096;
    auto src = pair.buffer(pair.a, n);
    auto dst = pair.buffer(pair.b, n);
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    const long long a_tx = hwCounter(pair.a.dev, "sim_tx_packets");
    const long long b_tx = hwCounter(pair.b.dev, "sim_tx_packets");
    ASSERT_EQ(postSend(pair.a.qp, IBV_WR_RDMA_WRITE, *src, 0, n, dst->addr(), dst->mr->rkey, 1), 0);
    ibv_wc wc{};
    ASSERT_TRUE(pollOne(pair.a.cq, &wc));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    EXPECT_EQ(hwCounter(pair.a.dev, "sim_tx_packets") - a_tx, 64);
    const long long acks = hwCounter(pair.b.dev, "sim_tx_packets") - b_tx;
    EXPECT_GE(acks, 1);
    EXPECT_LE(acks, 2) << "one ACK per AckReq at most";
}

// The transport timer is 4.096 us * 2^timeout: timeout 10 (4.2 ms), retry_cnt 3 gives four
// expiries, about 17 ms, before IBV_WC_RETRY_EXC_ERR.
TEST(SimTree, TransportTimerFollowsTheTimeoutExponent) {
    SKIP_UNLESS_SIMULATOR();
    ConnectOptions opt;
    opt.timeout = 10;
    opt.retry_cnt = 3;
    QpPair pair(opt);
    auto src = pair.buffer(pair.a, 64);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RESET;
    ASSERT_EQ(ibv_modify_qp(pair.b.qp, &a, IBV_QP_STATE), 0);
    const auto start = std::chrono::steady_clock::now();
    ASSERT_EQ(postSend(pair.a.qp, IBV_WR_RDMA_WRITE, *src, 0, 64, 0x1000, 0x1234, 1), 0);
    ibv_wc wc{};
    ASSERT_TRUE(pollOne(pair.a.cq, &wc));
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR);
    EXPECT_GE(ms, 4 * 4.194 * 0.95);
    EXPECT_LE(ms, 4 * 4.194 + 15) << "the timer is far slower than 4.096 us * 2^10";
}

TEST(SimTree, TakenUdpPortIsEaddrinuse) {
    SKIP_UNLESS_SIMULATOR();
    char tmpl[] = "/tmp/simhca-busy-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    runMksysfs(tmpl, "--dev busy0 --netdev busyeth --ip 127.98.0.1");
    // Another "process" has the endpoint: a socket on 127.98.0.1:4791.
    const int s = socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(4791);
    inet_pton(AF_INET, "127.98.0.1", &addr.sin_addr);
    ASSERT_EQ(bind(s, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)), 0);
    const std::string saved = config().sysfs_root;
    setenv("TENSORLANE_SYSFS_ROOT", tmpl, 1);
    ibv_context *ctx = openDevice("busy0");
    ASSERT_NE(ctx, nullptr);
    ibv_pd *pd = ibv_alloc_pd(ctx);
    ibv_cq *cq = ibv_create_cq(ctx, 4, nullptr, nullptr, 0);
    ibv_qp_init_attr init{};
    init.send_cq = cq;
    init.recv_cq = cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = init.cap.max_recv_wr = 1;
    init.cap.max_send_sge = init.cap.max_recv_sge = 1;
    errno = 0;
    EXPECT_EQ(ibv_create_qp(pd, &init), nullptr);
    EXPECT_EQ(errno, EADDRINUSE);
    close(s);
    ibv_qp *qp = ibv_create_qp(pd, &init);
    EXPECT_NE(qp, nullptr) << "the port is free again";
    if (qp != nullptr) {
        ibv_destroy_qp(qp);
    }
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    setenv("TENSORLANE_SYSFS_ROOT", saved.c_str(), 1);
}

// A raw UDP sender that crafts RoCEv2 packets as if from B towards A's endpoint.
class Injector {
public:
    Injector() {
        fd_ = socket(AF_INET, SOCK_DGRAM, 0);
        sockaddr_in src{};
        src.sin_family = AF_INET;
        inet_pton(AF_INET, config().ip_b.c_str(), &src.sin_addr);
        EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr *>(&src), sizeof(src)), 0);
        const int pmtu = IP_PMTUDISC_PROBE;  // DF, hence IPv4 id 0, as the simulator assumes
        setsockopt(fd_, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof(pmtu));
        socklen_t len = sizeof(src);
        getsockname(fd_, reinterpret_cast<sockaddr *>(&src), &len);
        flow_.src_ip = ntohl(src.sin_addr.s_addr);
        flow_.src_port = ntohs(src.sin_port);
        in_addr dst{};
        inet_pton(AF_INET, config().ip_a.c_str(), &dst);
        flow_.dst_ip = ntohl(dst.s_addr);
        flow_.dst_port = kRoceV2Port;
    }
    ~Injector() { close(fd_); }
    void sendRaw(const std::vector<uint8_t> &bytes) {
        sockaddr_in to{};
        to.sin_family = AF_INET;
        to.sin_port = htons(kRoceV2Port);
        to.sin_addr.s_addr = htonl(flow_.dst_ip);
        sendto(fd_, bytes.data(), bytes.size(), 0, reinterpret_cast<sockaddr *>(&to), sizeof(to));
    }
    // A well-formed packet with a correct ICRC.
    std::vector<uint8_t> packet(Opcode op, uint32_t qpn, uint32_t psn, const Reth *reth,
                                size_t payload) {
        const OpcodeInfo *info = opcodeInfo(static_cast<uint8_t>(op));
        const size_t pad = (4 - payload % 4) % 4;
        std::vector<uint8_t> p(info->header_bytes + payload + pad + kIcrcBytes, 0);
        Bth bth;
        bth.opcode = static_cast<uint8_t>(op);
        bth.dest_qpn = qpn;
        bth.psn = psn;
        bth.pad = static_cast<uint8_t>(pad);
        bth.ack_req = true;
        writeBth(p.data(), bth);
        if (reth != nullptr) {
            writeReth(p.data() + kBthBytes, *reth);
        }
        uint8_t ip_udp[kIpv4UdpBytes];
        buildIpv4UdpHeader(ip_udp, flow_, p.size());
        icrcStore(icrcOf(ip_udp, p.data(), p.size() - kIcrcBytes), p.data() + p.size() - 4);
        return p;
    }

private:
    int fd_;
    Ipv4UdpFlow flow_;
};

TEST(SimGarbage, MalformedPacketsAreDroppedAndCounted) {
    SKIP_UNLESS_SIMULATOR();
    QpPair pair;
    const std::string dev = pair.a.dev;
    Injector inj;
    const long long malformed = hwCounter(dev, "sim_rx_malformed");
    const long long icrc = hwCounter(dev, "rx_icrc_encapsulated");
    const long long unknown = hwCounter(dev, "sim_rx_unknown_qp");
    const long long ooo = hwCounter(dev, "out_of_sequence");
    // Truncated headers.
    inj.sendRaw({0x0a, 0x00, 0xff});
    inj.sendRaw(std::vector<uint8_t>(kBthBytes + 2, 0));
    // An opcode the simulator does not speak (UD SEND ONLY).
    auto ud = inj.packet(Opcode::kSendOnly, pair.a.qp->qp_num, 0, nullptr, 0);
    ud[0] = 0x64;
    inj.sendRaw(ud);
    // A bad ICRC.
    auto bad = inj.packet(Opcode::kSendOnly, pair.a.qp->qp_num, pair.opt.psn_b, nullptr, 16);
    bad.back() ^= 0xff;
    inj.sendRaw(bad);
    // An unknown QPN.
    inj.sendRaw(inj.packet(Opcode::kSendOnly, 0xabcdef, 0, nullptr, 8));
    // A PSN far ahead of the window.
    inj.sendRaw(inj.packet(Opcode::kSendOnly, pair.a.qp->qp_num,
                           (pair.opt.psn_b + 0x1000) & 0xffffff, nullptr, 8));
    EXPECT_GE(waitCounter(dev, "sim_rx_malformed", malformed + 3), malformed + 3);
    EXPECT_GE(waitCounter(dev, "rx_icrc_encapsulated", icrc + 1), icrc + 1);
    EXPECT_GE(waitCounter(dev, "sim_rx_unknown_qp", unknown + 1), unknown + 1);
    EXPECT_GE(waitCounter(dev, "out_of_sequence", ooo + 1), ooo + 1);
    // Nothing of it reached the application, and the QPs still work.
    auto src = pair.buffer(pair.b, 64);
    auto dst = pair.buffer(pair.a, 64);
    std::memset(src->data(), 0x77, 64);
    ASSERT_EQ(postSend(pair.b.qp, IBV_WR_RDMA_WRITE, *src, 0, 64, dst->addr(), dst->mr->rkey, 1),
              0);
    ibv_wc wc{};
    ASSERT_TRUE(pollOne(pair.b.cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(dst->data()[63], 0x77);
    EXPECT_FALSE(pollOne(pair.a.cq, &wc, 50));
}

TEST(SimGarbage, RethPastTheRegionIsARemoteAccessError) {
    SKIP_UNLESS_SIMULATOR();
    QpPair pair;
    auto dst = pair.buffer(pair.a, 4096);
    Injector inj;
    const long long before = hwCounter(pair.a.dev, "resp_remote_access_errors");
    Reth reth{dst->addr() + 4090, dst->mr->rkey, 64};
    inj.sendRaw(inj.packet(Opcode::kWriteOnly, pair.a.qp->qp_num, pair.opt.psn_b, &reth, 64));
    EXPECT_GE(waitCounter(pair.a.dev, "resp_remote_access_errors", before + 1), before + 1);
    EXPECT_EQ(QpPair::state(pair.a.qp), IBV_QPS_ERR);
    for (size_t i = 0; i < 4096; ++i) {
        ASSERT_EQ(dst->data()[i], 0) << "written past the checks at " << i;
    }
}

TEST(SimMemory, DmabufMrOnAnMmapableFd) {
    SKIP_UNLESS_SIMULATOR();
    QpPair pair;
    const size_t n = 1 << 16;
    // /dev/udmabuf turns a sealed memfd into a real dma-buf where the kernel has it; elsewhere
    // the memfd itself stands in (both are mmap-able, which is what the simulator needs).
    const int mfd = memfd_create("simhca-dmabuf", MFD_ALLOW_SEALING);
    ASSERT_GE(mfd, 0);
    ASSERT_EQ(ftruncate(mfd, n), 0);
    int fd = mfd;
    const int udmabuf = open("/dev/udmabuf", O_RDWR);
    if (udmabuf >= 0) {
        fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK);
        udmabuf_create create{};
        create.memfd = static_cast<uint32_t>(mfd);
        create.size = n;
        const int dbuf = ioctl(udmabuf, UDMABUF_CREATE, &create);
        if (dbuf >= 0) {
            fd = dbuf;
        }
        close(udmabuf);
    }
    ibv_mr *mr = ibv_reg_dmabuf_mr(pair.b.pd, 0, n, 0x100000, fd,
                                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ASSERT_NE(mr, nullptr) << strerror(errno);
    auto src = pair.buffer(pair.a, 4096);
    std::memset(src->data(), 0x3c, 4096);
    // The remote addresses the region by its iova.
    ASSERT_EQ(postSend(pair.a.qp, IBV_WR_RDMA_WRITE, *src, 0, 4096, 0x100000 + 8192, mr->rkey, 1),
              0);
    ibv_wc wc{};
    ASSERT_TRUE(pollOne(pair.a.cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    void *view = mmap(nullptr, n, PROT_READ, MAP_SHARED, fd, 0);
    ASSERT_NE(view, MAP_FAILED);
    EXPECT_EQ(static_cast<uint8_t *>(view)[8192], 0x3c);
    EXPECT_EQ(static_cast<uint8_t *>(view)[8192 + 4095], 0x3c);
    munmap(view, n);
    ibv_dereg_mr(mr);
    if (fd != mfd) {
        close(fd);
    }
    close(mfd);
}

}  // namespace
}  // namespace tensorlane::simhca::test
