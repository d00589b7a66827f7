// The QP state machine and attribute masks, against the kernel's table (qp_state_table and
// ib_modify_qp_is_ok() in drivers/infiniband/core/verbs.c): every transition, every required
// bit left out, every bit that is neither required nor optional added.
#include <gtest/gtest.h>

#include <cerrno>
#include <vector>

#include "verbs_fixture.hpp"

namespace tensorlane::simhca::test {
namespace {

struct Expected {
    bool valid = false;
    int req = 0;
    int opt = 0;
};

constexpr int kStates = IBV_QPS_ERR + 1;

// The RC column of the kernel's qp_state_table, written out again here (independently of the
// simulator's copy) as the expectation.
Expected expected(ibv_qp_state cur, ibv_qp_state next) {
    const int all_rtr_opt = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
    if (next == IBV_QPS_RESET) {
        return {true, 0, 0};
    }
    if (next == IBV_QPS_ERR) {
        return {cur != IBV_QPS_RESET, 0, 0};
    }
    switch (cur) {
        case IBV_QPS_RESET:
            if (next == IBV_QPS_INIT) {
                return {true, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0};
            }
            break;
        case IBV_QPS_INIT:
            if (next == IBV_QPS_INIT) {
                return {true, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS};
            }
            if (next == IBV_QPS_RTR) {
                return {true,
                        IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                            IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
                        all_rtr_opt};
            }
            break;
        case IBV_QPS_RTR:
            if (next == IBV_QPS_RTS) {
                return {true,
                        IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                            IBV_QP_MAX_QP_RD_ATOMIC,
                        IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS |
                            IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE};
            }
            break;
        case IBV_QPS_RTS:
            if (next == IBV_QPS_RTS) {
                return {true, 0,
                        IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH |
                            IBV_QP_PATH_MIG_STATE | IBV_QP_MIN_RNR_TIMER};
            }
            if (next == IBV_QPS_SQD) {
                return {true, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY};
            }
            break;
        case IBV_QPS_SQD:
            if (next == IBV_QPS_RTS) {
                return {true, 0,
                        IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS |
                            IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE};
            }
            if (next == IBV_QPS_SQD) {
                return {true, 0,
                        IBV_QP_PORT | IBV_QP_AV | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                            IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC |
                            IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX |
                            IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE};
            }
            break;
        default:
            break;
    }
    return {};
}

const int kAllBits[] = {IBV_QP_CUR_STATE,
                        IBV_QP_EN_SQD_ASYNC_NOTIFY,
                        IBV_QP_ACCESS_FLAGS,
                        IBV_QP_PKEY_INDEX,
                        IBV_QP_PORT,
                        IBV_QP_QKEY,
                        IBV_QP_AV,
                        IBV_QP_PATH_MTU,
                        IBV_QP_TIMEOUT,
                        IBV_QP_RETRY_CNT,
                        IBV_QP_RNR_RETRY,
                        IBV_QP_RQ_PSN,
                        IBV_QP_MAX_QP_RD_ATOMIC,
                        IBV_QP_ALT_PATH,
                        IBV_QP_MIN_RNR_TIMER,
                        IBV_QP_SQ_PSN,
                        IBV_QP_MAX_DEST_RD_ATOMIC,
                        IBV_QP_PATH_MIG_STATE,
                        IBV_QP_CAP,
                        IBV_QP_DEST_QPN};

// Valid values for every attribute, so only the mask decides.
ibv_qp_attr fullAttr(const QpPair &pair, ibv_qp_state cur, ibv_qp_state next) {
    ibv_qp_attr a{};
    a.qp_state = next;
    a.cur_qp_state = cur;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qkey = 0x11111111;
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    a.ah_attr.grh.dgid = pair.b.gid;
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(pair.a.gid_index);
    a.ah_attr.grh.hop_limit = 64;
    a.alt_ah_attr = a.ah_attr;
    a.alt_port_num = 1;
    a.path_mtu = IBV_MTU_1024;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.rq_psn = 1;
    a.sq_psn = 1;
    a.max_rd_atomic = 1;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.path_mig_state = IBV_MIG_MIGRATED;
    a.dest_qp_num = pair.b.qp->qp_num;
    a.cap.max_send_wr = 64;
    a.cap.max_recv_wr = 64;
    a.cap.max_send_sge = 4;
    a.cap.max_recv_sge = 4;
    return a;
}

// Drives pair.a's QP from RESET to state s along the usual path.
void driveTo(QpPair &pair, ibv_qp_state s) {
    ibv_qp_attr a = fullAttr(pair, IBV_QPS_RESET, IBV_QPS_RESET);
    ASSERT_EQ(ibv_modify_qp(pair.a.qp, &a, IBV_QP_STATE), 0);
    const ibv_qp_state path[] = {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_SQD};
    ibv_qp_state cur = IBV_QPS_RESET;
    if (s == IBV_QPS_RESET) {
        return;
    }
    if (s == IBV_QPS_ERR) {
        a = fullAttr(pair, cur, IBV_QPS_INIT);
        ASSERT_EQ(ibv_modify_qp(pair.a.qp, &a, IBV_QP_STATE | expected(cur, IBV_QPS_INIT).req), 0);
        a.qp_state = IBV_QPS_ERR;
        ASSERT_EQ(ibv_modify_qp(pair.a.qp, &a, IBV_QP_STATE), 0);
        return;
    }
    for (ibv_qp_state next : path) {
        a = fullAttr(pair, cur, next);
        ASSERT_EQ(ibv_modify_qp(pair.a.qp, &a, IBV_QP_STATE | expected(cur, next).req), 0)
            << cur << "->" << next;
        cur = next;
        if (cur == s) {
            return;
        }
    }
}

class StateMachine : public ::testing::TestWithParam<int> {};

TEST_P(StateMachine, MasksAsTheKernelTable) {
    const auto cur = static_cast<ibv_qp_state>(GetParam());
    QpPair pair;
    for (int n = 0; n < kStates; ++n) {
        const auto next = static_cast<ibv_qp_state>(n);
        if (next == IBV_QPS_SQE || cur == IBV_QPS_SQE) {
            continue;  // SQE is entered by the HCA only
        }
        const Expected e = expected(cur, next);
        SCOPED_TRACE(::testing::Message() << "transition " << cur << " -> " << next);
        driveTo(pair, cur);
        ibv_qp_attr a = fullAttr(pair, cur, next);
        if (!e.valid) {
            EXPECT_EQ(ibv_modify_qp(pair.a.qp, &a,
                                    IBV_QP_STATE | expected(IBV_QPS_RESET, IBV_QPS_INIT).req),
                      EINVAL);
            EXPECT_EQ(ibv_modify_qp(pair.a.qp, &a, IBV_QP_STATE), EINVAL);
            continue;
        }
        for (int bit : kAllBits) {
            if (e.req & bit) {
                EXPECT_EQ(ibv_modify_qp(pair.a.qp, &a, IBV_QP_STATE | (e.req & ~bit)), EINVAL)
                    << "required bit 0x" << std::hex << bit << " missing";
            } else if (!(e.opt & bit)) {
                EXPECT_EQ(ibv_modify_qp(pair.a.qp, &a, IBV_QP_STATE | e.req | bit), EINVAL)
                    << "extra bit 0x" << std::hex << bit;
            }
        }
        EXPECT_EQ(QpPair::state(pair.a.qp), cur) << "a failed modify changed the state";
        EXPECT_EQ(ibv_modify_qp(pair.a.qp, &a, IBV_QP_STATE | e.req), 0);
        EXPECT_EQ(QpPair::state(pair.a.qp), next);
        // Optional bits are accepted one at a time (RoCE forbids alternate paths).
        for (int bit : kAllBits) {
            if (!(e.opt & bit) || bit == IBV_QP_ALT_PATH) {
                continue;
            }
            driveTo(pair, cur);
            a = fullAttr(pair, cur, next);
            EXPECT_EQ(ibv_modify_qp(pair.a.qp, &a, IBV_QP_STATE | e.req | bit), 0)
                << "optional bit 0x" << std::hex << bit;
        }
    }
}

std::string stateName(const ::testing::TestParamInfo<int> &p) {
    static const char *const kNames[] = {"Reset", "Init", "Rtr", "Rts", "Sqd", "Sqe", "Err"};
    return kNames[p.param];
}

INSTANTIATE_TEST_SUITE_P(FromEachState, StateMachine,
                         ::testing::Values(IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS,
                                           IBV_QPS_SQD, IBV_QPS_ERR),
                         stateName);

TEST(StateMachineValues, TimeoutAbove31IsEinval) {
    QpPair pair;
    driveTo(pair, IBV_QPS_RTR);
    ibv_qp_attr a = fullAttr(pair, IBV_QPS_RTR, IBV_QPS_RTS);
    a.timeout = 32;
    EXPECT_EQ(ibv_modify_qp(pair.a.qp, &a, IBV_QP_STATE | expected(IBV_QPS_RTR, IBV_QPS_RTS).req),
              EINVAL);
    a.timeout = 31;
    EXPECT_EQ(ibv_modify_qp(pair.a.qp, &a, IBV_QP_STATE | expected(IBV_QPS_RTR, IBV_QPS_RTS).req),
              0);
}

TEST(StateMachineValues, PathMtuAboveThePortIsEinval) {
    QpPair pair;
    driveTo(pair, IBV_QPS_INIT);
    ibv_qp_attr a = fullAttr(pair, IBV_QPS_INIT, IBV_QPS_RTR);
    const int mask = IBV_QP_STATE | expected(IBV_QPS_INIT, IBV_QPS_RTR).req;
    if (pair.a.port.active_mtu < IBV_MTU_4096) {
        a.path_mtu = static_cast<ibv_mtu>(pair.a.port.active_mtu + 1);
        EXPECT_EQ(ibv_modify_qp(pair.a.qp, &a, mask), EINVAL);
    }
    a.path_mtu = static_cast<ibv_mtu>(7);  // not an MTU
    EXPECT_EQ(ibv_modify_qp(pair.a.qp, &a, mask), EINVAL);
    a.path_mtu = pair.a.port.active_mtu;
    EXPECT_EQ(ibv_modify_qp(pair.a.qp, &a, mask), 0);
}

TEST(StateMachineValues, BadPortGidOrStateIsEinval) {
    QpPair pair;
    driveTo(pair, IBV_QPS_RESET);
    ibv_qp_attr a = fullAttr(pair, IBV_QPS_RESET, IBV_QPS_INIT);
    const int init_mask = IBV_QP_STATE | expected(IBV_QPS_RESET, IBV_QPS_INIT).req;
    a.port_num = 9;
    EXPECT_EQ(ibv_modify_qp(pair.a.qp, &a, init_mask), EINVAL);
    a.port_num = 1;
    a.qp_state = static_cast<ibv_qp_state>(IBV_QPS_ERR + 1);
    EXPECT_EQ(ibv_modify_qp(pair.a.qp, &a, init_mask), EINVAL);
    a.qp_state = IBV_QPS_INIT;
    ASSERT_EQ(ibv_modify_qp(pair.a.qp, &a, init_mask), 0);
    a = fullAttr(pair, IBV_QPS_INIT, IBV_QPS_RTR);
    const int rtr_mask = IBV_QP_STATE | expected(IBV_QPS_INIT, IBV_QPS_RTR).req;
    a.ah_attr.grh.sgid_index = 200;  // beyond the GID table
    EXPECT_EQ(ibv_modify_qp(pair.a.qp, &a, rtr_mask), EINVAL);
    a = fullAttr(pair, IBV_QPS_INIT, IBV_QPS_RTR);
    a.ah_attr.is_global = 0;  // RoCE needs a GRH (rdma_check_ah_attr())
    EXPECT_EQ(ibv_modify_qp(pair.a.qp, &a, rtr_mask), EINVAL);
    a = fullAttr(pair, IBV_QPS_INIT, IBV_QPS_RTR);
    a.cur_qp_state = IBV_QPS_INIT;  // IB_QP_CUR_STATE is refused from INIT
    EXPECT_EQ(ibv_modify_qp(pair.a.qp, &a, rtr_mask | IBV_QP_CUR_STATE), EINVAL);
}

TEST(StateMachineValues, ResetToErrIsEinvalAndAnyStateToReset) {
    QpPair pair;
    driveTo(pair, IBV_QPS_RESET);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    EXPECT_EQ(ibv_modify_qp(pair.a.qp, &a, IBV_QP_STATE), EINVAL);
    for (ibv_qp_state s : {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_SQD, IBV_QPS_ERR}) {
        driveTo(pair, s);
        a.qp_state = IBV_QPS_RESET;
        EXPECT_EQ(ibv_modify_qp(pair.a.qp, &a, IBV_QP_STATE), 0) << s;
        EXPECT_EQ(QpPair::state(pair.a.qp), IBV_QPS_RESET);
    }
}

}  // namespace
}  // namespace tensorlane::simhca::test
