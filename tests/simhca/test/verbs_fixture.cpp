#include "verbs_fixture.hpp"

#include <arpa/inet.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <thread>

namespace tensorlane::simhca::test {
namespace {

std::string envOr(const char *name, const std::string &fallback) {
    const char *v = std::getenv(name);
    return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

Config makeConfig() {
    Config c;
    const std::string hw = envOr("SIMHCA_CONFORMANCE_DEVICE", "");
    if (!hw.empty()) {
        c.simulator = false;
        c.sysfs_root = "/sys";
        c.dev_a = hw;
        c.dev_b = envOr("SIMHCA_CONFORMANCE_DEVICE_B", hw);
        c.gid_index_a = std::atoi(envOr("SIMHCA_CONFORMANCE_GID_INDEX", "3").c_str());
        c.gid_index_b = std::atoi(
            envOr("SIMHCA_CONFORMANCE_GID_INDEX_B", std::to_string(c.gid_index_a)).c_str());
        return c;
    }
    // Addresses unique to this process within 127.0.0.0/8 (all loopback on Linux).
    const unsigned pid = static_cast<unsigned>(getpid());
    const std::string net =
        "127." + std::to_string(10 + (pid >> 8) % 200) + "." + std::to_string(pid & 0xff) + ".";
    c.ip_a = net + "2";
    c.ip_b = net + "3";
    char tmpl[] = "/tmp/simhca-tree-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
        throw std::runtime_error("mkdtemp failed");
    }
    c.sysfs_root = tmpl;
    c.dev_a = "simA";
    c.dev_b = "simB";
    runMksysfs(c.sysfs_root, "--dev simA --netdev simeth0 --ip " + c.ip_a + " --mtu 4200");
    runMksysfs(c.sysfs_root, "--dev simB --netdev simeth1 --ip " + c.ip_b + " --mtu 4200");
    setenv("TENSORLANE_SYSFS_ROOT", c.sysfs_root.c_str(), 1);
    return c;
}

}  // namespace

const Config &config() {
    static const Config c = makeConfig();
    return c;
}

void runMksysfs(const std::string &root, const std::string &args) {
    const std::string cmd = std::string(SIMHCA_MKSYSFS) + " " + root + " " + args;
    if (std::system(cmd.c_str()) != 0) {
        throw std::runtime_error("mksysfs failed: " + cmd);
    }
}

long long hwCounter(const std::string &dev, const std::string &name) {
    std::ifstream in(config().sysfs_root + "/class/infiniband/" + dev + "/ports/1/hw_counters/" +
                     name);
    long long v = -1;
    if (in) {
        in >> v;
    }
    return v;
}

long long waitCounter(const std::string &dev, const std::string &name, long long at_least,
                      int timeout_ms) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    long long v = hwCounter(dev, name);
    while (v < at_least && std::chrono::steady_clock::now() < end) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        v = hwCounter(dev, name);
    }
    return v;
}

Buffer::~Buffer() {
    if (mr != nullptr) {
        ibv_dereg_mr(mr);
    }
}

ibv_context *openDevice(const std::string &name) {
    int n = 0;
    ibv_device **list = ibv_get_device_list(&n);
    ibv_context *ctx = nullptr;
    for (int i = 0; list != nullptr && i < n; ++i) {
        if (name == ibv_get_device_name(list[i])) {
            ctx = ibv_open_device(list[i]);
        }
    }
    ibv_free_device_list(list);
    return ctx;
}

QpPair::QpPair(const ConnectOptions &o) : opt(o) {
    const Config &c = config();
    a.dev = c.dev_a;
    b.dev = c.dev_b;
    a.gid_index = c.gid_index_a;
    b.gid_index = c.gid_index_b;
    for (Side *s : {&a, &b}) {
        s->ctx = openDevice(s->dev);
        if (s->ctx == nullptr) {
            throw std::runtime_error("cannot open device " + s->dev);
        }
        s->pd = ibv_alloc_pd(s->ctx);
        s->channel = ibv_create_comp_channel(s->ctx);
        s->cq = ibv_create_cq(s->ctx, opt.cqe, nullptr, s->channel, 0);
        ibv_query_port(s->ctx, 1, &s->port);
        ibv_query_gid(s->ctx, 1, s->gid_index, &s->gid);
        ibv_qp_init_attr_ex init{};
        init.send_cq = s->cq;
        init.recv_cq = s->cq;
        init.qp_type = IBV_QPT_RC;
        init.cap.max_send_wr = opt.max_send_wr;
        init.cap.max_recv_wr = opt.max_recv_wr;
        init.cap.max_send_sge = 4;
        init.cap.max_recv_sge = 4;
        init.cap.max_inline_data = opt.max_inline;
        init.comp_mask = IBV_QP_INIT_ATTR_PD;
        init.pd = s->pd;
        if (opt.wr_api) {
            init.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
            init.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                                  IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_READ;
        }
        s->qp = ibv_create_qp_ex(s->ctx, &init);
        if (s->qp == nullptr) {
            throw std::runtime_error("ibv_create_qp_ex failed: " + std::string(strerror(errno)));
        }
    }
    if (connect(a, b, opt.psn_a, opt.psn_b) != 0 || connect(b, a, opt.psn_b, opt.psn_a) != 0) {
        throw std::runtime_error("connect failed");
    }
}

QpPair::~QpPair() {
    for (Side *s : {&a, &b}) {
        if (s->qp)
            ibv_destroy_qp(s->qp);
        if (s->cq)
            ibv_destroy_cq(s->cq);
        if (s->channel)
            ibv_destroy_comp_channel(s->channel);
        if (s->pd)
            ibv_dealloc_pd(s->pd);
        if (s->ctx)
            ibv_close_device(s->ctx);
    }
}

int QpPair::connect(Side &self, const Side &peer, uint32_t my_psn, uint32_t peer_psn) {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = 1;
    attr.qp_access_flags = opt.access;
    if (int rc = ibv_modify_qp(
            self.qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
        return rc;
    }
    attr = ibv_qp_attr{};
    attr.qp_state = IBV_QPS_RTR;
    attr.path_mtu = opt.mtu != 0 ? static_cast<ibv_mtu>(opt.mtu) : self.port.active_mtu;
    attr.dest_qp_num = peer.qp->qp_num;
    attr.rq_psn = peer_psn;
    attr.max_dest_rd_atomic = 4;
    attr.min_rnr_timer = opt.min_rnr_timer;
    attr.ah_attr.is_global = 1;
    attr.ah_attr.port_num = 1;
    attr.ah_attr.grh.dgid = peer.gid;
    attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(self.gid_index);
    attr.ah_attr.grh.hop_limit = 64;
    attr.ah_attr.grh.traffic_class = opt.traffic_class;
    if (int rc =
            ibv_modify_qp(self.qp, &attr,
                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                              IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
        return rc;
    }
    attr = ibv_qp_attr{};
    attr.qp_state = IBV_QPS_RTS;
    attr.timeout = opt.timeout;
    attr.retry_cnt = opt.retry_cnt;
    attr.rnr_retry = opt.rnr_retry;
    attr.sq_psn = my_psn;
    attr.max_rd_atomic = 4;
    return ibv_modify_qp(self.qp, &attr,
                         IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                             IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

std::unique_ptr<Buffer> QpPair::buffer(Side &s, size_t n, unsigned access) {
    auto buf = std::make_unique<Buffer>();
    buf->bytes.assign(n, 0);
    buf->mr = ibv_reg_mr(s.pd, buf->bytes.data(), n, static_cast<int>(access));
    if (buf->mr == nullptr) {
        throw std::runtime_error("ibv_reg_mr failed");
    }
    return buf;
}

ibv_qp_state QpPair::state(ibv_qp *qp) {
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    ibv_query_qp(qp, &attr, IBV_QP_STATE, &init);
    return attr.qp_state;
}

bool pollOne(ibv_cq *cq, ibv_wc *wc, int timeout_ms) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < end) {
        const int n = ibv_poll_cq(cq, 1, wc);
        if (n > 0) {
            return true;
        }
        if (n < 0) {
            return false;
        }
        std::this_thread::yield();
    }
    return false;
}

std::vector<ibv_wc> pollN(ibv_cq *cq, int n, int timeout_ms) {
    std::vector<ibv_wc> out;
    ibv_wc wc;
    while (static_cast<int>(out.size()) < n && pollOne(cq, &wc, timeout_ms)) {
        out.push_back(wc);
    }
    return out;
}

bool getAsyncEvent(ibv_context *ctx, ibv_async_event *ev, int timeout_ms) {
    pollfd pfd{ctx->async_fd, POLLIN, 0};
    if (poll(&pfd, 1, timeout_ms) != 1) {
        return false;
    }
    return ibv_get_async_event(ctx, ev) == 0;
}

int postSend(ibv_qp *qp, ibv_wr_opcode op, Buffer &local, size_t off, uint32_t len,
             uint64_t remote_addr, uint32_t rkey, uint64_t wr_id, unsigned flags,
             uint32_t imm_host) {
    ibv_sge sge{local.addr() + off, len, local.mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = flags;
    wr.imm_data = htonl(imm_host);
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr *bad = nullptr;
    return ibv_post_send(qp, &wr, &bad);
}

int postRecv(ibv_qp *qp, Buffer &buf, size_t off, uint32_t len, uint64_t wr_id) {
    ibv_sge sge{buf.addr() + off, len, buf.mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr *bad = nullptr;
    return ibv_post_recv(qp, &wr, &bad);
}

}  // namespace tensorlane::simhca::test
