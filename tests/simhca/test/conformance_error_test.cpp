// RC errors and retries: RNR NAK and rnr_retry, transport retries and retry_cnt, remote access
// errors (R_Key, bounds, access rights) taking both QPs to ERR, local protection and length
// errors, flush errors in ERR, posting limits (IB spec 9.7.5.2.8, 9.7.6.1.3, 9.9.3, 10.3.1;
// ibv_post_send(3)).
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "verbs_fixture.hpp"

namespace tensorlane::simhca::test {
namespace {

TEST(RcErrors, RnrNakWaitsForAReceiveWqe) {
    ConnectOptions opt;
    opt.min_rnr_timer = 1;  // 0.01 ms
    opt.rnr_retry = 7;      // forever
    QpPair pair(opt);
    auto src = pair.buffer(pair.a, 256);
    auto dst = pair.buffer(pair.b, 256);
    const long long before = hwCounter(pair.b.dev, "out_of_buffer");
    ASSERT_EQ(postSend(pair.a.qp, IBV_WR_RDMA_WRITE_WITH_IMM, *src, 0, 256, dst->addr(),
                       dst->mr->rkey, 1, IBV_SEND_SIGNALED, 7),
              0);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ibv_wc wc{};
    EXPECT_FALSE(pollOne(pair.a.cq, &wc, 10)) << "completed without a receive WQE";
    ASSERT_EQ(postRecv(pair.b.qp, *dst, 0, 0, 2), 0);
    ASSERT_TRUE(pollOne(pair.b.cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
    ASSERT_TRUE(pollOne(pair.a.cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_GT(waitCounter(pair.b.dev, "out_of_buffer", before + 1), before);
    EXPECT_GT(hwCounter(pair.a.dev, "rnr_nak_retry_err"), 0);
}

TEST(RcErrors, RnrRetryExceeded) {
    ConnectOptions opt;
    opt.rnr_retry = 2;
    opt.min_rnr_timer = 1;
    QpPair pair(opt);
    auto src = pair.buffer(pair.a, 64);
    ASSERT_EQ(postSend(pair.a.qp, IBV_WR_SEND, *src, 0, 64, 0, 0, 1), 0);
    ibv_wc wc{};
    ASSERT_TRUE(pollOne(pair.a.cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_RNR_RETRY_EXC_ERR);
    EXPECT_EQ(QpPair::state(pair.a.qp), IBV_QPS_ERR);
}

TEST(RcErrors, TransportRetryExceededWhenThePeerIsGone) {
    ConnectOptions opt;
    opt.timeout = 8;  // 1 ms
    opt.retry_cnt = 2;
    QpPair pair(opt);
    auto src = pair.buffer(pair.a, 64);
    auto dst = pair.buffer(pair.b, 64);
    const uint32_t rkey = dst->mr->rkey;
    const uint64_t addr = dst->addr();
    // The responder disappears: its QP is reset, so nothing answers.
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RESET;
    ASSERT_EQ(ibv_modify_qp(pair.b.qp, &a, IBV_QP_STATE), 0);
    const long long before = hwCounter(pair.a.dev, "local_ack_timeout_err");
    const auto start = std::chrono::steady_clock::now();
    ASSERT_EQ(postSend(pair.a.qp, IBV_WR_RDMA_WRITE, *src, 0, 64, addr, rkey, 1), 0);
    ibv_wc wc{};
    ASSERT_TRUE(pollOne(pair.a.cq, &wc));
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
    EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR);
    // 1 try + 2 retries of ~1 ms each (4.096 us * 2^8); hardware may add its own slack.
    EXPECT_GE(ms, 2);
    EXPECT_EQ(QpPair::state(pair.a.qp), IBV_QPS_ERR);
    EXPECT_GE(waitCounter(pair.a.dev, "local_ack_timeout_err", before + 3), before + 3);
}

void expectRemoteAccessError(QpPair &pair, uint64_t addr, uint32_t rkey, uint32_t len) {
    auto src = pair.buffer(pair.a, 8192);
    auto rbuf = pair.buffer(pair.b, 64);
    ASSERT_EQ(postRecv(pair.b.qp, *rbuf, 0, 64, 50), 0);
    ASSERT_EQ(postSend(pair.a.qp, IBV_WR_RDMA_WRITE, *src, 0, len, addr, rkey, 1), 0);
    ASSERT_EQ(postSend(pair.a.qp, IBV_WR_RDMA_WRITE, *src, 0, 8, addr, rkey, 2), 0);
    ibv_wc wc{};
    ASSERT_TRUE(pollOne(pair.a.cq, &wc));
    EXPECT_EQ(wc.wr_id, 1u);
    EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR);
    ASSERT_TRUE(pollOne(pair.a.cq, &wc));
    EXPECT_EQ(wc.wr_id, 2u);
    EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
    // Both QPs are in ERR; the responder's posted receive is flushed.
    EXPECT_EQ(QpPair::state(pair.a.qp), IBV_QPS_ERR);
    ASSERT_TRUE(pollOne(pair.b.cq, &wc));
    EXPECT_EQ(wc.wr_id, 50u);
    EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(QpPair::state(pair.b.qp), IBV_QPS_ERR);
    // The responder's application hears of it on its async fd.
    ibv_async_event ev{};
    ASSERT_TRUE(getAsyncEvent(pair.b.ctx, &ev));
    EXPECT_EQ(ev.event_type, IBV_EVENT_QP_ACCESS_ERR);
    EXPECT_EQ(ev.element.qp, pair.b.qp);
    ibv_ack_async_event(&ev);
}

TEST(RcErrors, BadRkeyIsARemoteAccessErrorOnBothQps) {
    QpPair pair;
    auto dst = pair.buffer(pair.b, 4096);
    expectRemoteAccessError(pair, dst->addr(), dst->mr->rkey ^ 0x80, 64);
}

TEST(RcErrors, WritePastTheRegionIsARemoteAccessError) {
    QpPair pair;
    auto dst = pair.buffer(pair.b, 4096);
    expectRemoteAccessError(pair, dst->addr() + 4000, dst->mr->rkey, 200);
    if (config().simulator) {
        EXPECT_GE(waitCounter(pair.b.dev, "resp_remote_access_errors", 1), 1);
    }
}

TEST(RcErrors, WriteStartingBelowTheRegionIsARemoteAccessError) {
    QpPair pair;
    auto dst = pair.buffer(pair.b, 4096);
    expectRemoteAccessError(pair, dst->addr() - 64, dst->mr->rkey, 128);
}

TEST(RcErrors, WriteToAQpWithoutRemoteWriteIsARemoteAccessError) {
    // The MR grants remote write, the responder's QP does not (IB spec 10.6.3.2: both decide).
    ConnectOptions opt;
    opt.access = IBV_ACCESS_REMOTE_READ;
    QpPair pair(opt);
    auto dst = pair.buffer(pair.b, 4096);
    expectRemoteAccessError(pair, dst->addr(), dst->mr->rkey, 64);
}

TEST(RcErrors, WriteToAReadOnlyRegionIsARemoteAccessError) {
    QpPair pair;
    auto dst = pair.buffer(pair.b, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    expectRemoteAccessError(pair, dst->addr(), dst->mr->rkey, 64);
}

TEST(RcErrors, BadLkeyIsALocalProtectionError) {
    QpPair pair;
    auto src = pair.buffer(pair.a, 64);
    auto dst = pair.buffer(pair.b, 64);
    ibv_sge sge{src->addr(), 64, src->mr->lkey + 0x1000};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = dst->addr();
    wr.wr.rdma.rkey = dst->mr->rkey;
    ibv_send_wr *bad = nullptr;
    ASSERT_EQ(ibv_post_send(pair.a.qp, &wr, &bad), 0);
    ibv_wc wc{};
    ASSERT_TRUE(pollOne(pair.a.cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR);
    EXPECT_EQ(QpPair::state(pair.a.qp), IBV_QPS_ERR);
}

TEST(RcErrors, SendLongerThanTheReceiveBuffer) {
    QpPair pair;
    auto src = pair.buffer(pair.a, 2048);
    auto dst = pair.buffer(pair.b, 2048);
    ASSERT_EQ(postRecv(pair.b.qp, *dst, 0, 1000, 1), 0);
    ASSERT_EQ(postSend(pair.a.qp, IBV_WR_SEND, *src, 0, 2048, 0, 0, 2), 0);
    ibv_wc wc{};
    ASSERT_TRUE(pollOne(pair.b.cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_LOC_LEN_ERR);
    ASSERT_TRUE(pollOne(pair.a.cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR);
}

TEST(RcErrors, EverythingOutstandingFlushesInErr) {
    QpPair pair;
    auto buf = pair.buffer(pair.b, 4096);
    for (int i = 0; i < 5; ++i) {
        ASSERT_EQ(postRecv(pair.b.qp, *buf, 0, 64, 100 + i), 0);
    }
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    ASSERT_EQ(ibv_modify_qp(pair.b.qp, &a, IBV_QP_STATE), 0);
    auto wcs = pollN(pair.b.cq, 5);
    ASSERT_EQ(wcs.size(), 5u);
    for (int i = 0; i < 5; ++i) {
        EXPECT_EQ(wcs[i].wr_id, static_cast<uint64_t>(100 + i));
        EXPECT_EQ(wcs[i].status, IBV_WC_WR_FLUSH_ERR);
    }
    // Posting in ERR completes at once with a flush error, signalled or not.
    ASSERT_EQ(postSend(pair.b.qp, IBV_WR_SEND, *buf, 0, 8, 0, 0, 7, 0), 0);
    ASSERT_EQ(postRecv(pair.b.qp, *buf, 0, 8, 8), 0);
    wcs = pollN(pair.b.cq, 2);
    ASSERT_EQ(wcs.size(), 2u);
    for (const ibv_wc &wc : wcs) {
        EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
    }
}

TEST(RcErrors, PostingLimits) {
    ConnectOptions opt;
    opt.max_send_wr = 4;
    QpPair pair(opt);
    auto src = pair.buffer(pair.a, 64);
    // A QP that is not ready to send refuses the post.
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RESET;
    ASSERT_EQ(ibv_modify_qp(pair.b.qp, &a, IBV_QP_STATE), 0);
    EXPECT_EQ(postSend(pair.b.qp, IBV_WR_SEND, *src, 0, 8, 0, 0, 1), EINVAL);
    // Too many SGEs.
    ibv_sge sges[8];
    for (auto &s : sges) {
        s = ibv_sge{src->addr(), 8, src->mr->lkey};
    }
    ibv_send_wr wr{};
    wr.sg_list = sges;
    wr.num_sge = 8;
    wr.opcode = IBV_WR_SEND;
    ibv_send_wr *bad = nullptr;
    EXPECT_EQ(ibv_post_send(pair.a.qp, &wr, &bad), EINVAL);
    EXPECT_EQ(bad, &wr);
    // A full send queue (the peer is in RESET, so nothing completes).
    int rc = 0;
    int posted = 0;
    for (; posted < 100 && rc == 0; ++posted) {
        rc = postSend(pair.a.qp, IBV_WR_SEND, *src, 0, 8, 0, 0, posted, 0);
    }
    EXPECT_EQ(rc, ENOMEM);
    EXPECT_GE(posted - 1, 4);
}

TEST(RcErrors, CqOverrunRaisesCqErr) {
    ConnectOptions opt;
    opt.cqe = 2;
    QpPair pair(opt);
    auto src = pair.buffer(pair.a, 64);
    auto dst = pair.buffer(pair.b, 64);
    for (int i = 0; i < 8; ++i) {
        ASSERT_EQ(postSend(pair.a.qp, IBV_WR_RDMA_WRITE, *src, 0, 8, dst->addr(), dst->mr->rkey, i),
                  0);
    }
    // The CQ reports the overrun, and the QP that could not complete goes to ERR with a fatal
    // event (IB spec 11.6.3: CQ error; 10.10.4: the affected QPs enter the error state).
    ibv_async_event ev{};
    bool cq_err = false;
    bool qp_fatal = false;
    for (int tries = 0; tries < 6 && !(cq_err && qp_fatal); ++tries) {
        ASSERT_TRUE(getAsyncEvent(pair.a.ctx, &ev));
        cq_err = cq_err || ev.event_type == IBV_EVENT_CQ_ERR;
        qp_fatal = qp_fatal || (ev.event_type == IBV_EVENT_QP_FATAL && ev.element.qp == pair.a.qp);
        ibv_ack_async_event(&ev);
    }
    EXPECT_TRUE(cq_err);
    EXPECT_TRUE(qp_fatal);
    EXPECT_EQ(QpPair::state(pair.a.qp), IBV_QPS_ERR);
}

}  // namespace
}  // namespace tensorlane::simhca::test
