#include "transport/verbs/wc_status.hpp"

namespace tensorlane::sidecar {

WcMeaning meaningOf(ibv_wc_status status) {
    switch (status) {
        case IBV_WC_SUCCESS:
            return {Code::kOk, "success"};
        case IBV_WC_RETRY_EXC_ERR:
            return {Code::kPeer,
                    "transport retry counter exceeded: no ACK came back. Right at the start this "
                    "is almost always the GID index (a GID the peer cannot route to), the traffic "
                    "class (a DSCP the switches drop or do not map to a lossless priority) or PFC "
                    "off on that priority; later, the link or the peer went away. Run "
                    "`tensorlane diag` on both nodes"};
        case IBV_WC_RNR_RETRY_EXC_ERR:
            return {Code::kPeer,
                    "receiver not ready, retries exhausted: the peer's receive queue was empty "
                    "(its sidecar stalled, or rnr_retry is too small)"};
        case IBV_WC_REM_ACCESS_ERR:
            return {Code::kNotFound,
                    "remote access error: the peer refused the rkey or the range (a region "
                    "revoked at the peer, or a descriptor out of date)"};
        case IBV_WC_REM_INV_REQ_ERR:
            return {Code::kInvalid, "remote invalid request: the peer could not parse the request"};
        case IBV_WC_REM_OP_ERR:
            return {Code::kPeer, "remote operation error at the peer's HCA"};
        case IBV_WC_REM_ABORT_ERR:
            return {Code::kPeer, "the peer aborted the operation"};
        case IBV_WC_WR_FLUSH_ERR:
            return {Code::kPeer, "flushed: the queue pair went to the error state before this ran"};
        case IBV_WC_LOC_LEN_ERR:
            return {Code::kInternal,
                    "local length error (a bug: a work request larger than "
                    "its buffers or the port's max message size)"};
        case IBV_WC_LOC_QP_OP_ERR:
            return {Code::kInternal, "local QP operation error (a bug in the work requests)"};
        case IBV_WC_LOC_EEC_OP_ERR:
            return {Code::kInternal, "local EEC operation error"};
        case IBV_WC_LOC_PROT_ERR:
            return {Code::kInternal,
                    "local protection error: an lkey or address outside its "
                    "memory region (a bug)"};
        case IBV_WC_LOC_RDD_VIOL_ERR:
            return {Code::kInternal, "local RDD violation"};
        case IBV_WC_MW_BIND_ERR:
            return {Code::kInternal, "memory window bind error"};
        case IBV_WC_BAD_RESP_ERR:
            return {Code::kPeer, "bad response from the peer"};
        case IBV_WC_LOC_ACCESS_ERR:
            return {Code::kInternal,
                    "local access error: memory registered without the access "
                    "this operation needs"};
        case IBV_WC_REM_INV_RD_REQ_ERR:
            return {Code::kPeer, "remote invalid read request"};
        case IBV_WC_INV_EECN_ERR:
        case IBV_WC_INV_EEC_STATE_ERR:
            return {Code::kInternal, "EEC error"};
        case IBV_WC_FATAL_ERR:
            return {Code::kPeer, "fatal error of the HCA"};
        case IBV_WC_RESP_TIMEOUT_ERR:
            return {Code::kPeer, "response timeout"};
        case IBV_WC_GENERAL_ERR:
            return {Code::kPeer, "general error"};
        case IBV_WC_TM_ERR:
        case IBV_WC_TM_RNDV_INCOMPLETE:
            return {Code::kInternal, "tag matching error"};
    }
    return {Code::kInternal, "unknown work completion status"};
}

}  // namespace tensorlane::sidecar
