// Exported verbs: the string and rate helpers of libibverbs/enum_strs.c and verbs.c, and the
// kernel-ABI copy helpers other rdma-core libraries import (no kernel here: no-ops).
#include <infiniband/verbs.h>

#include <cerrno>

extern "C" {

const char *ibv_node_type_str(ibv_node_type node_type) {
    switch (node_type) {
        case IBV_NODE_CA:
            return "InfiniBand channel adapter";
        case IBV_NODE_SWITCH:
            return "InfiniBand switch";
        case IBV_NODE_ROUTER:
            return "InfiniBand router";
        case IBV_NODE_RNIC:
            return "iWARP NIC";
        case IBV_NODE_USNIC:
            return "usNIC";
        case IBV_NODE_USNIC_UDP:
            return "usNIC UDP";
        case IBV_NODE_UNSPECIFIED:
            return "unspecified";
        default:
            return "unknown";
    }
}

const char *ibv_port_state_str(ibv_port_state port_state) {
    static const char *const kNames[] = {"no state",   "PORT_DOWN",   "PORT_INIT",
                                         "PORT_ARMED", "PORT_ACTIVE", "PORT_ACTIVE_DEFER"};
    return port_state >= 0 && port_state <= IBV_PORT_ACTIVE_DEFER ? kNames[port_state] : "unknown";
}

const char *ibv_event_type_str(ibv_event_type event) {
    static const char *const kNames[] = {"CQ error",
                                         "local work queue catastrophic error",
                                         "invalid request local work queue error",
                                         "local access violation work queue error",
                                         "communication established",
                                         "send queue drained",
                                         "path migrated",
                                         "path migration request error",
                                         "local catastrophic error",
                                         "port active",
                                         "port error",
                                         "LID change",
                                         "P_Key change",
                                         "SM change",
                                         "SRQ catastrophic error",
                                         "SRQ limit reached",
                                         "last WQE reached",
                                         "client reregistration",
                                         "GID table change",
                                         "WQ fatal"};
    return event >= 0 && event <= IBV_EVENT_WQ_FATAL ? kNames[event] : "unknown";
}

const char *ibv_wc_status_str(ibv_wc_status status) {
    static const char *const kNames[] = {"success",
                                         "local length error",
                                         "local QP operation error",
                                         "local EE context operation error",
                                         "local protection error",
                                         "Work Request Flushed Error",
                                         "memory management operation error",
                                         "bad response error",
                                         "local access error",
                                         "remote invalid request error",
                                         "remote access error",
                                         "remote operation error",
                                         "transport retry counter exceeded",
                                         "RNR retry counter exceeded",
                                         "local RDD violation error",
                                         "remote invalid RD request",
                                         "aborted error",
                                         "invalid EE context number",
                                         "invalid EE context state",
                                         "fatal error",
                                         "response timeout error",
                                         "general error",
                                         "TM error",
                                         "TM Rendezvous Pending"};
    return status >= 0 && status <= IBV_WC_TM_RNDV_INCOMPLETE ? kNames[status] : "unknown";
}

int ibv_rate_to_mult(ibv_rate rate) {
    switch (rate) {
        case IBV_RATE_2_5_GBPS:
            return 1;
        case IBV_RATE_5_GBPS:
            return 2;
        case IBV_RATE_10_GBPS:
            return 4;
        case IBV_RATE_20_GBPS:
            return 8;
        case IBV_RATE_30_GBPS:
            return 12;
        case IBV_RATE_40_GBPS:
            return 16;
        case IBV_RATE_60_GBPS:
            return 24;
        case IBV_RATE_80_GBPS:
            return 32;
        case IBV_RATE_120_GBPS:
            return 48;
        default:
            return -1;
    }
}

ibv_rate mult_to_ibv_rate(int mult) {
    switch (mult) {
        case 1:
            return IBV_RATE_2_5_GBPS;
        case 2:
            return IBV_RATE_5_GBPS;
        case 4:
            return IBV_RATE_10_GBPS;
        case 8:
            return IBV_RATE_20_GBPS;
        case 12:
            return IBV_RATE_30_GBPS;
        case 16:
            return IBV_RATE_40_GBPS;
        case 24:
            return IBV_RATE_60_GBPS;
        case 32:
            return IBV_RATE_80_GBPS;
        case 48:
            return IBV_RATE_120_GBPS;
        default:
            return IBV_RATE_MAX;
    }
}

int ibv_rate_to_mbps(ibv_rate rate) {
    static const int kMbps[] = {-1,     2500,   10000,  30000,  5000,   20000,  40000,
                                60000,  80000,  120000, 14062,  56250,  112500, 168750,
                                25781,  103125, 206250, 309375, 50000,  400000, 600000,
                                200000, 300000, 28125,  100000, 800000, 1200000};
    return rate >= 0 && rate < static_cast<int>(sizeof(kMbps) / sizeof(kMbps[0])) ? kMbps[rate]
                                                                                  : -1;
}

ibv_rate mbps_to_ibv_rate(int mbps) {
    for (int r = 1; r <= IBV_RATE_1200_GBPS; ++r) {
        if (ibv_rate_to_mbps(static_cast<ibv_rate>(r)) == mbps) {
            return static_cast<ibv_rate>(r);
        }
    }
    return IBV_RATE_MAX;
}

// Kernel-ABI copies (libibverbs/marshall.c): used by librdmacm with a kernel; nothing to do.
void ibv_copy_qp_attr_from_kern(void *, const void *) {}
void ibv_copy_ah_attr_from_kern(void *, const void *) {}
void ibv_copy_path_rec_from_kern(void *, const void *) {}
void ibv_copy_path_rec_to_kern(void *, const void *) {}

int ibv_resolve_eth_l2_from_gid(ibv_context *, ibv_ah_attr *, uint8_t *, uint16_t *) {
    return EOPNOTSUPP;  // no neighbour table: layer 2 is the kernel's business here
}

}  // extern "C"
