#include "qp_state_table.hpp"

namespace tensorlane::simhca {
namespace {

struct Transition {
    bool valid;
    int required;
    int optional;
};

constexpr int kNumStates = IBV_QPS_ERR + 1;

// The RC column of the kernel's qp_state_table. Note what the kernel does not allow: RESET to
// ERR, and anything but RESET or ERR from ERR.
struct TransitionTable {
    Transition t[kNumStates][kNumStates];
};

constexpr TransitionTable kTransitions = [] {
    TransitionTable table{};
    auto set = [&table](ibv_qp_state from, ibv_qp_state to, int req, int opt) {
        table.t[from][to] = Transition{true, req, opt};
    };
    set(IBV_QPS_RESET, IBV_QPS_RESET, 0, 0);
    set(IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0);
    for (int s = IBV_QPS_INIT; s <= IBV_QPS_ERR; ++s) {
        set(static_cast<ibv_qp_state>(s), IBV_QPS_RESET, 0, 0);
        set(static_cast<ibv_qp_state>(s), IBV_QPS_ERR, 0, 0);
    }
    set(IBV_QPS_INIT, IBV_QPS_INIT, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    set(IBV_QPS_INIT, IBV_QPS_RTR,
        IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
            IBV_QP_MIN_RNR_TIMER,
        IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX);
    set(IBV_QPS_RTR, IBV_QPS_RTS,
        IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
            IBV_QP_MAX_QP_RD_ATOMIC,
        IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
            IBV_QP_PATH_MIG_STATE);
    set(IBV_QPS_RTS, IBV_QPS_RTS, 0,
        IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE |
            IBV_QP_MIN_RNR_TIMER);
    set(IBV_QPS_RTS, IBV_QPS_SQD, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY);
    set(IBV_QPS_SQD, IBV_QPS_RTS, 0,
        IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
            IBV_QP_PATH_MIG_STATE);
    set(IBV_QPS_SQD, IBV_QPS_SQD, 0,
        IBV_QP_PORT | IBV_QP_AV | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
            IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_ALT_PATH |
            IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE);
    // SQE -> RTS exists in the table, but RC has no optional attributes there.
    set(IBV_QPS_SQE, IBV_QPS_RTS, 0, 0);
    return table;
}();

}  // namespace

bool modifyQpIsOk(ibv_qp_state cur, ibv_qp_state next, int mask) {
    if (cur < 0 || cur >= kNumStates || next < 0 || next >= kNumStates) {
        return false;
    }
    // IB_QP_CUR_STATE is accepted only from RTR, RTS, SQD and SQE.
    if ((mask & IBV_QP_CUR_STATE) && cur != IBV_QPS_RTR && cur != IBV_QPS_RTS &&
        cur != IBV_QPS_SQD && cur != IBV_QPS_SQE) {
        return false;
    }
    const Transition &t = kTransitions.t[cur][next];
    if (!t.valid) {
        return false;
    }
    if ((mask & t.required) != t.required) {
        return false;
    }
    return (mask & ~(t.required | t.optional | IBV_QP_STATE)) == 0;
}

}  // namespace tensorlane::simhca
