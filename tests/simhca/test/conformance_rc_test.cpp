// RC semantics that succeed: WRITE, WRITE WITH IMMEDIATE, SEND/RECV, READ, multi-packet
// messages, PSNs from any start (wrapping), unsignalled WRs, post lists, inline data, the
// ibv_wr_* API, completion channels (ibv_poll_cq(3), ibv_post_send(3), IB spec 9.4, 9.7, 11.4).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <poll.h>

#include <cstring>
#include <numeric>

#include "verbs_fixture.hpp"

namespace tensorlane::simhca::test {
namespace {

void fillPattern(uint8_t *p, size_t n, uint8_t seed) {
    for (size_t i = 0; i < n; ++i) {
        p[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 8));
    }
}

TEST(Device, ListQueryAndPort) {
    const Config &c = config();
    ibv_context *ctx = openDevice(c.dev_a);
    ASSERT_NE(ctx, nullptr);
    ibv_device_attr dev{};
    ASSERT_EQ(ibv_query_device(ctx, &dev), 0);
    EXPECT_GE(dev.phys_port_cnt, 1);
    EXPECT_GE(dev.max_qp_wr, 64);
    ibv_port_attr port{};
    ASSERT_EQ(ibv_query_port(ctx, 1, &port), 0);
    EXPECT_EQ(port.state, IBV_PORT_ACTIVE);
    EXPECT_EQ(port.link_layer, IBV_LINK_LAYER_ETHERNET);
    ibv_gid_entry entry{};
    ASSERT_EQ(ibv_query_gid_ex(ctx, 1, static_cast<uint32_t>(c.gid_index_a), &entry, 0), 0);
    EXPECT_EQ(entry.gid_type, IBV_GID_TYPE_ROCE_V2);
    EXPECT_EQ(entry.gid.raw[10], 0xff);  // IPv4-mapped
    EXPECT_EQ(entry.gid.raw[11], 0xff);
    if (c.simulator) {
        in_addr a{};
        std::memcpy(&a, entry.gid.raw + 12, 4);
        EXPECT_EQ(std::string(inet_ntoa(a)), c.ip_a);
    }
    // async_fd and cmd_fd are real descriptors.
    pollfd pfd{ctx->async_fd, POLLIN, 0};
    EXPECT_EQ(poll(&pfd, 1, 0), 0);
    EXPECT_EQ(pfd.revents & POLLNVAL, 0);
    EXPECT_GE(ctx->cmd_fd, 0);
    EXPECT_EQ(ibv_close_device(ctx), 0);
}

TEST(Rc, WriteWithImmediatePlacesDataAndConsumesARecv) {
    QpPair pair;
    auto src = pair.buffer(pair.a, 3 * 4096 + 100);
    auto dst = pair.buffer(pair.b, 3 * 4096 + 100);
    auto rbuf = pair.buffer(pair.b, 64);
    fillPattern(src->data(), src->bytes.size(), 3);
    ASSERT_EQ(postRecv(pair.b.qp, *rbuf, 0, 64, 77), 0);
    ASSERT_EQ(postSend(pair.a.qp, IBV_WR_RDMA_WRITE_WITH_IMM, *src, 0,
                       static_cast<uint32_t>(src->bytes.size()), dst->addr(), dst->mr->rkey, 5,
                       IBV_SEND_SIGNALED, 0xdeadbeef),
              0);
    ibv_wc wc{};
    ASSERT_TRUE(pollOne(pair.b.cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
    EXPECT_EQ(wc.wr_id, 77u);
    EXPECT_TRUE(wc.wc_flags & IBV_WC_WITH_IMM);
    EXPECT_EQ(ntohl(wc.imm_data), 0xdeadbeefu);
    EXPECT_EQ(wc.byte_len, src->bytes.size());
    EXPECT_EQ(wc.qp_num, pair.b.qp->qp_num);
    EXPECT_EQ(wc.src_qp, pair.a.qp->qp_num);
    // The data is in place before the receive completes (IB spec o9-...: RC places in order).
    EXPECT_EQ(std::memcmp(src->data(), dst->data(), src->bytes.size()), 0);
    ASSERT_TRUE(pollOne(pair.a.cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.opcode, IBV_WC_RDMA_WRITE);
    EXPECT_EQ(wc.wr_id, 5u);
}

TEST(Rc, SendRecvMultiPacketWithImmediate) {
    QpPair pair;
    const size_t n = 10000;
    auto src = pair.buffer(pair.a, n);
    auto dst = pair.buffer(pair.b, 16384);
    fillPattern(src->data(), n, 9);
    ASSERT_EQ(postRecv(pair.b.qp, *dst, 0, 16384, 1), 0);
    ASSERT_EQ(postSend(pair.a.qp, IBV_WR_SEND_WITH_IMM, *src, 0, n, 0, 0, 2, IBV_SEND_SIGNALED, 42),
              0);
    ibv_wc wc{};
    ASSERT_TRUE(pollOne(pair.b.cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.opcode, IBV_WC_RECV);
    EXPECT_EQ(wc.byte_len, n);
    EXPECT_TRUE(wc.wc_flags & IBV_WC_WITH_IMM);
    EXPECT_EQ(ntohl(wc.imm_data), 42u);
    EXPECT_EQ(std::memcmp(src->data(), dst->data(), n), 0);
    ASSERT_TRUE(pollOne(pair.a.cq, &wc));
    EXPECT_EQ(wc.opcode, IBV_WC_SEND);
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
}

TEST(Rc, RdmaReadMultiPacket) {
    QpPair pair;
    const size_t n = 5 * 4096 + 17;
    auto remote = pair.buffer(pair.b, n);
    auto local = pair.buffer(pair.a, n);
    fillPattern(remote->data(), n, 1);
    ASSERT_EQ(
        postSend(pair.a.qp, IBV_WR_RDMA_READ, *local, 0, n, remote->addr(), remote->mr->rkey, 9),
        0);
    ibv_wc wc{};
    ASSERT_TRUE(pollOne(pair.a.cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.opcode, IBV_WC_RDMA_READ);
    EXPECT_EQ(wc.byte_len, n);
    EXPECT_EQ(std::memcmp(local->data(), remote->data(), n), 0);
    if (config().simulator) {
        EXPECT_GE(waitCounter(pair.b.dev, "rx_read_requests", 1), 1);
    }
}

TEST(Rc, PsnsFromAnyStartWrapAround) {
    ConnectOptions opt;
    opt.psn_a = 0xfffffd;  // the messages below cross 2^24
    opt.psn_b = 0xffffff;
    QpPair pair(opt);
    const size_t n = 8 * 4096;
    auto src = pair.buffer(pair.a, n);
    auto dst = pair.buffer(pair.b, n);
    for (int round = 0; round < 3; ++round) {
        fillPattern(src->data(), n, static_cast<uint8_t>(round));
        ASSERT_EQ(
            postSend(pair.a.qp, IBV_WR_RDMA_WRITE, *src, 0, n, dst->addr(), dst->mr->rkey, round),
            0);
        ibv_wc wc{};
        ASSERT_TRUE(pollOne(pair.a.cq, &wc));
        ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
        EXPECT_EQ(std::memcmp(src->data(), dst->data(), n), 0);
    }
    // The READ's responses cross the wrap of B's send PSN space too.
    auto back = pair.buffer(pair.b, n);
    ASSERT_EQ(postSend(pair.b.qp, IBV_WR_RDMA_READ, *back, 0, n, src->addr(), src->mr->rkey, 7), 0);
    ibv_wc wc{};
    ASSERT_TRUE(pollOne(pair.b.cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(std::memcmp(back->data(), src->data(), n), 0);
}

TEST(Rc, UnsignalledPostListCompletesOnce) {
    QpPair pair;
    const int kWrs = 16;
    auto src = pair.buffer(pair.a, kWrs * 512);
    auto dst = pair.buffer(pair.b, kWrs * 512);
    fillPattern(src->data(), src->bytes.size(), 4);
    std::vector<ibv_sge> sges(kWrs);
    std::vector<ibv_send_wr> wrs(kWrs);
    for (int i = 0; i < kWrs; ++i) {
        sges[i] = ibv_sge{src->addr() + i * 512, 512, src->mr->lkey};
        wrs[i] = ibv_send_wr{};
        wrs[i].wr_id = static_cast<uint64_t>(i);
        wrs[i].sg_list = &sges[i];
        wrs[i].num_sge = 1;
        wrs[i].opcode = IBV_WR_RDMA_WRITE;
        wrs[i].send_flags = i == kWrs - 1 ? IBV_SEND_SIGNALED : 0;
        wrs[i].wr.rdma.remote_addr = dst->addr() + i * 512;
        wrs[i].wr.rdma.rkey = dst->mr->rkey;
        wrs[i].next = i + 1 < kWrs ? &wrs[i + 1] : nullptr;
    }
    ibv_send_wr *bad = nullptr;
    ASSERT_EQ(ibv_post_send(pair.a.qp, wrs.data(), &bad), 0);
    ibv_wc wc{};
    ASSERT_TRUE(pollOne(pair.a.cq, &wc));
    EXPECT_EQ(wc.wr_id, static_cast<uint64_t>(kWrs - 1));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_FALSE(pollOne(pair.a.cq, &wc, 100)) << "an unsignalled WR completed";
    EXPECT_EQ(std::memcmp(src->data(), dst->data(), src->bytes.size()), 0);
}

TEST(Rc, InlineDataIsCopiedAtPost) {
    ConnectOptions opt;
    opt.max_inline = 128;
    QpPair pair(opt);
    auto src = pair.buffer(pair.a, 128);
    auto dst = pair.buffer(pair.b, 128);
    std::memset(src->data(), 0x5a, 128);
    ibv_sge sge{src->addr(), 100, 0};  // inline data needs no lkey
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
    wr.wr.rdma.remote_addr = dst->addr();
    wr.wr.rdma.rkey = dst->mr->rkey;
    ibv_send_wr *bad = nullptr;
    ASSERT_EQ(ibv_post_send(pair.a.qp, &wr, &bad), 0);
    std::memset(src->data(), 0x11, 128);  // allowed at once for inline data
    ibv_wc wc{};
    ASSERT_TRUE(pollOne(pair.a.cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    for (int i = 0; i < 100; ++i) {
        ASSERT_EQ(dst->data()[i], 0x5a) << i;
    }
    EXPECT_EQ(dst->data()[100], 0);
    // More than max_inline_data is refused at post time.
    sge.length = 129;
    EXPECT_EQ(ibv_post_send(pair.a.qp, &wr, &bad), EINVAL);
    EXPECT_EQ(bad, &wr);
}

TEST(Rc, NewPostSendApi) {
    ConnectOptions opt;
    opt.wr_api = true;
    QpPair pair(opt);
    auto src = pair.buffer(pair.a, 6000);
    auto dst = pair.buffer(pair.b, 6000);
    auto rbuf = pair.buffer(pair.b, 16);
    fillPattern(src->data(), 6000, 8);
    ASSERT_EQ(postRecv(pair.b.qp, *rbuf, 0, 16, 3), 0);
    ibv_qp_ex *qpx = ibv_qp_to_qp_ex(pair.a.qp);
    ASSERT_NE(qpx, nullptr);
    ibv_wr_start(qpx);
    qpx->wr_id = 11;
    qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_write_imm(qpx, dst->mr->rkey, dst->addr(), htonl(0x1234));
    ibv_wr_set_sge(qpx, src->mr->lkey, src->addr(), 6000);
    ASSERT_EQ(ibv_wr_complete(qpx), 0);
    ibv_wc wc{};
    ASSERT_TRUE(pollOne(pair.b.cq, &wc));
    EXPECT_EQ(wc.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
    EXPECT_EQ(ntohl(wc.imm_data), 0x1234u);
    EXPECT_EQ(wc.byte_len, 6000u);
    ASSERT_TRUE(pollOne(pair.a.cq, &wc));
    EXPECT_EQ(wc.wr_id, 11u);
    EXPECT_EQ(std::memcmp(src->data(), dst->data(), 6000), 0);
}

TEST(Rc, CompletionChannelWakesOnTheNextCompletion) {
    QpPair pair;
    auto src = pair.buffer(pair.a, 64);
    auto dst = pair.buffer(pair.b, 64);
    ASSERT_EQ(ibv_req_notify_cq(pair.a.cq, 0), 0);
    pollfd pfd{pair.a.channel->fd, POLLIN, 0};
    EXPECT_EQ(poll(&pfd, 1, 0), 0) << "an event before any completion";
    ASSERT_EQ(postSend(pair.a.qp, IBV_WR_RDMA_WRITE, *src, 0, 64, dst->addr(), dst->mr->rkey, 1),
              0);
    ASSERT_EQ(poll(&pfd, 1, 5000), 1);
    ibv_cq *ev_cq = nullptr;
    void *ev_ctx = nullptr;
    ASSERT_EQ(ibv_get_cq_event(pair.a.channel, &ev_cq, &ev_ctx), 0);
    EXPECT_EQ(ev_cq, pair.a.cq);
    ibv_ack_cq_events(ev_cq, 1);
    ibv_wc wc{};
    ASSERT_TRUE(pollOne(pair.a.cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    // Not armed again: the next completion raises no event.
    ASSERT_EQ(postSend(pair.a.qp, IBV_WR_RDMA_WRITE, *src, 0, 64, dst->addr(), dst->mr->rkey, 2),
              0);
    ASSERT_TRUE(pollOne(pair.a.cq, &wc));
    EXPECT_EQ(poll(&pfd, 1, 50), 0);
}

}  // namespace
}  // namespace tensorlane::simhca::test
