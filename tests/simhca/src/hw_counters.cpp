#include "hw_counters.hpp"

#include <sys/stat.h>

#include "sysfs_tree.hpp"

namespace tensorlane::simhca {
namespace {

constexpr const char *kNames[] = {
    "out_of_sequence",
    "packet_seq_err",
    "local_ack_timeout_err",
    "rnr_nak_retry_err",
    "duplicate_request",
    "implied_nak_seq_err",
    "rx_write_requests",
    "rx_read_requests",
    "out_of_buffer",
    "resp_remote_access_errors",
    "req_remote_access_errors",
    "req_remote_invalid_request",
    "resp_local_length_error",
    "req_cqe_error",
    "resp_cqe_error",
    "req_cqe_flush_error",
    "resp_cqe_flush_error",
    "rx_icrc_encapsulated",
    "rx_atomic_requests",
    "roce_adp_retrans",
    "np_cnp_sent",
    "rp_cnp_handled",
    "np_ecn_marked_roce_packets",
    "sim_rx_packets",
    "sim_tx_packets",
    "sim_tx_retransmits",
    "sim_rx_malformed",
    "sim_rx_unknown_qp",
    "sim_dropped_port_down",
};
static_assert(sizeof(kNames) / sizeof(kNames[0]) == static_cast<size_t>(Counter::kCount));

}  // namespace

const char *HwCounters::name(Counter c) {
    return kNames[static_cast<int>(c)];
}

void HwCounters::load(const std::string &dir) {
    for (int i = 0; i < static_cast<int>(Counter::kCount); ++i) {
        const auto v = readTrimmed(dir + "/" + kNames[i]);
        if (v) {
            values_[i].store(parseLeadingInt(*v).value_or(0), std::memory_order_relaxed);
        }
    }
}

void HwCounters::flush(const std::string &dir, bool force) {
    if (!dirty_.exchange(false, std::memory_order_relaxed) && !force) {
        return;
    }
    ::mkdir(dir.c_str(), 0755);
    for (int i = 0; i < static_cast<int>(Counter::kCount); ++i) {
        writeAtomically(dir + "/" + kNames[i],
                        std::to_string(values_[i].load(std::memory_order_relaxed)) + "\n");
    }
}

}  // namespace tensorlane::simhca
