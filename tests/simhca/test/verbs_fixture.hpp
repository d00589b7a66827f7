// Test support written against the verbs API alone, so the conformance suite runs unchanged on
// the simulated HCA and on a real RoCE HCA (docs/simhca.md, "Conformance on hardware").
//
// Simulator mode (no SIMHCA_CONFORMANCE_DEVICE): the process writes its own sysfs tree with
// mksysfs.sh, two devices on loopback addresses unique to this process (so CTest may run
// suites in parallel), and points TENSORLANE_SYSFS_ROOT at it before the first verbs call.
// Hardware mode: SIMHCA_CONFORMANCE_DEVICE=<dev> [SIMHCA_CONFORMANCE_DEVICE_B=<dev>]
// [SIMHCA_CONFORMANCE_GID_INDEX=<n>] and the QPs connect through that HCA.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tensorlane::simhca::test {

/// Where the suite runs.
struct Config {
    bool simulator = true;
    std::string sysfs_root;  ///< the tree the simulator reads (or /sys on hardware)
    std::string dev_a, dev_b;
    int gid_index_a = 3, gid_index_b = 3;
    std::string ip_a, ip_b;  ///< simulator mode: the two devices' addresses
};

/// The configuration, set up on first use (writes the tree in simulator mode).
const Config &config();
/// Writes a tree with mksysfs.sh (simulator mode): args are passed through.
void runMksysfs(const std::string &root, const std::string &args);
/// The value of a port's hw counter from the tree (or /sys), or -1.
long long hwCounter(const std::string &dev, const std::string &name);
/// Waits until hwCounter(dev, name) >= at_least (counters are written back periodically).
long long waitCounter(const std::string &dev, const std::string &name, long long at_least,
                      int timeout_ms = 2000);

/// A registered buffer.
struct Buffer {
    std::vector<uint8_t> bytes;
    ibv_mr *mr = nullptr;
    ~Buffer();
    uint8_t *data() { return bytes.data(); }
    uint64_t addr() const { return reinterpret_cast<uint64_t>(bytes.data()); }
};

/// How a pair of QPs is connected.
struct ConnectOptions {
    uint32_t psn_a = 0x123456;
    uint32_t psn_b = 0xabcdef;
    uint8_t timeout = 12;  // 16.8 ms
    uint8_t retry_cnt = 7;
    uint8_t rnr_retry = 7;
    uint8_t min_rnr_timer = 1;  // 0.01 ms
    int mtu = 0;                // 0: the port's active MTU
    unsigned access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    uint8_t traffic_class = 0;
    uint32_t max_send_wr = 64;
    uint32_t max_recv_wr = 64;
    uint32_t max_inline = 0;
    int cqe = 256;
    bool wr_api = false;  // create with IBV_QP_EX_WITH_* send ops
};

/// One side: context, PD, CQ, QP.
struct Side {
    ibv_context *ctx = nullptr;
    ibv_pd *pd = nullptr;
    ibv_comp_channel *channel = nullptr;
    ibv_cq *cq = nullptr;
    ibv_qp *qp = nullptr;
    int gid_index = 0;
    ibv_gid gid{};
    ibv_port_attr port{};
    std::string dev;
};

/// Two RC QPs, A on device A and B on device B, connected to each other.
class QpPair {
public:
    explicit QpPair(const ConnectOptions &opt = {});
    ~QpPair();
    QpPair(const QpPair &) = delete;
    QpPair &operator=(const QpPair &) = delete;

    Side a, b;
    ConnectOptions opt;

    /// Moves a QP to INIT, RTR and RTS towards its peer (0 or the failing errno).
    int connect(Side &self, const Side &peer, uint32_t my_psn, uint32_t peer_psn);
    /// Registers a buffer on a side.
    std::unique_ptr<Buffer> buffer(Side &s, size_t n,
                                   unsigned access = IBV_ACCESS_LOCAL_WRITE |
                                                     IBV_ACCESS_REMOTE_WRITE |
                                                     IBV_ACCESS_REMOTE_READ);
    /// The QP's state as ibv_query_qp reports it.
    static ibv_qp_state state(ibv_qp *qp);
};

/// Opens a device by name (nullptr if absent).
ibv_context *openDevice(const std::string &name);
/// Polls one completion within timeout_ms; false on timeout.
bool pollOne(ibv_cq *cq, ibv_wc *wc, int timeout_ms = 5000);
/// Polls n completions.
std::vector<ibv_wc> pollN(ibv_cq *cq, int n, int timeout_ms = 5000);
/// Takes an async event, waiting up to timeout_ms on async_fd; false on timeout.
bool getAsyncEvent(ibv_context *ctx, ibv_async_event *ev, int timeout_ms = 5000);
/// Posts one WR with one SGE.
int postSend(ibv_qp *qp, ibv_wr_opcode op, Buffer &local, size_t off, uint32_t len,
             uint64_t remote_addr, uint32_t rkey, uint64_t wr_id,
             unsigned flags = IBV_SEND_SIGNALED, uint32_t imm_host = 0);
/// Posts one receive WQE with one SGE.
int postRecv(ibv_qp *qp, Buffer &buf, size_t off, uint32_t len, uint64_t wr_id);

}  // namespace tensorlane::simhca::test
