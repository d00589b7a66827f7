// simhca_exchange: a verbs-only traffic program for the fault tests. The client writes --count
// messages with RDMA WRITE WITH IMMEDIATE into a ring of --window slots at the server; each
// message carries its sequence number, length and a CRC of its body. The server checks that
// every message arrives exactly once, in order (the immediate), intact (the CRC), and returns
// credits by RDMA WRITE into the client's credit word, so a slot is never overwritten before
// it was checked. Exit status 0 only if all of that held. Bootstrap over TCP.
//
//   simhca_exchange --role server|client --dev NAME [--gid N] --bind IP --peer IP --tcp-port P
//                   [--count N] [--size S] [--window W] [--timeout T] [--retry R]
//                   [--deadline-s S]
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

struct Wire {
    uint32_t qpn, psn, rkey, pad;
    uint64_t addr;
    uint8_t gid[16];
};

struct Msg {
    uint32_t seq, len, crc;
};

int fail(const char *what) {
    std::fprintf(stderr, "simhca_exchange: %s: %s\n", what, std::strerror(errno));
    return 1;
}

int tcpExchange(bool server, const std::string &bind_ip, const std::string &peer, int port,
                const Wire &mine, Wire &theirs) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    int fd;
    if (server) {
        const int ls = socket(AF_INET, SOCK_STREAM, 0);
        const int one = 1;
        setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        inet_pton(AF_INET, bind_ip.c_str(), &a.sin_addr);
        if (bind(ls, reinterpret_cast<sockaddr *>(&a), sizeof(a)) != 0 || listen(ls, 1) != 0) {
            return -1;
        }
        fd = accept(ls, nullptr, nullptr);
        close(ls);
    } else {
        inet_pton(AF_INET, peer.c_str(), &a.sin_addr);
        fd = socket(AF_INET, SOCK_STREAM, 0);
        for (int i = 0; i < 100 && connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)) != 0;
             ++i) {
            close(fd);
            usleep(50000);
            fd = socket(AF_INET, SOCK_STREAM, 0);
        }
    }
    if (fd < 0 || write(fd, &mine, sizeof(mine)) != sizeof(mine) ||
        read(fd, &theirs, sizeof(theirs)) != sizeof(theirs)) {
        return -1;
    }
    return fd;
}

}  // namespace

int main(int argc, char **argv) {
    std::string role, dev, bind_ip, peer;
    int gid_index = 3, port = 18515, count = 1000, window = 16, timeout = 10, retry = 7;
    size_t size = 8192;
    double deadline_s = 60;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string k = argv[i], v = argv[i + 1];
        if (k == "--role")
            role = v;
        else if (k == "--dev")
            dev = v;
        else if (k == "--gid")
            gid_index = std::stoi(v);
        else if (k == "--bind")
            bind_ip = v;
        else if (k == "--peer")
            peer = v;
        else if (k == "--tcp-port")
            port = std::stoi(v);
        else if (k == "--count")
            count = std::stoi(v);
        else if (k == "--size")
            size = std::stoul(v);
        else if (k == "--window")
            window = std::stoi(v);
        else if (k == "--timeout")
            timeout = std::stoi(v);
        else if (k == "--retry")
            retry = std::stoi(v);
        else if (k == "--deadline-s")
            deadline_s = std::stod(v);
    }
    const bool server = role == "server";
    int n = 0;
    ibv_device **list = ibv_get_device_list(&n);
    ibv_context *ctx = nullptr;
    for (int i = 0; i < n; ++i) {
        if (dev == ibv_get_device_name(list[i]))
            ctx = ibv_open_device(list[i]);
    }
    if (ctx == nullptr)
        return fail("open device");
    ibv_pd *pd = ibv_alloc_pd(ctx);
    ibv_cq *cq = ibv_create_cq(ctx, 4 * window + 16, nullptr, nullptr, 0);
    std::vector<uint8_t> ring(size * static_cast<size_t>(window));
    std::vector<uint8_t> staging(size * static_cast<size_t>(window));
    uint64_t credit = 0;  // client: messages the server has checked
    ibv_mr *ring_mr =
        ibv_reg_mr(pd, ring.data(), ring.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ibv_mr *stage_mr = ibv_reg_mr(pd, staging.data(), staging.size(), IBV_ACCESS_LOCAL_WRITE);
    ibv_mr *credit_mr =
        ibv_reg_mr(pd, &credit, sizeof(credit), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ibv_qp_init_attr init{};
    init.send_cq = init.recv_cq = cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = static_cast<uint32_t>(2 * window);
    init.cap.max_recv_wr = static_cast<uint32_t>(2 * window);
    init.cap.max_send_sge = init.cap.max_recv_sge = 1;
    init.cap.max_inline_data = 64;
    ibv_qp *qp = ibv_create_qp(pd, &init);
    if (qp == nullptr)
        return fail("create qp");
    ibv_port_attr pattr{};
    ibv_query_port(ctx, 1, &pattr);
    Wire mine{}, theirs{};
    mine.qpn = qp->qp_num;
    mine.psn = static_cast<uint32_t>(std::random_device{}()) & 0xffffff;
    mine.rkey = server ? ring_mr->rkey : credit_mr->rkey;
    mine.addr =
        server ? reinterpret_cast<uint64_t>(ring.data()) : reinterpret_cast<uint64_t>(&credit);
    ibv_gid gid{};
    ibv_query_gid(ctx, 1, gid_index, &gid);
    std::memcpy(mine.gid, gid.raw, 16);
    const int tcp = tcpExchange(server, bind_ip, peer, port, mine, theirs);
    if (tcp < 0)
        return fail("tcp bootstrap");
    // The peer may die with the link down (no FIN gets through): never wait for it forever.
    const timeval tcp_timeout{3, 0};
    setsockopt(tcp, SOL_SOCKET, SO_RCVTIMEO, &tcp_timeout, sizeof(tcp_timeout));
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        return fail("INIT");
    a = ibv_qp_attr{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = pattr.active_mtu;
    a.dest_qp_num = theirs.qpn;
    a.rq_psn = theirs.psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, theirs.gid, 16);
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(gid_index);
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.grh.traffic_class = 106;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        return fail("RTR");
    a = ibv_qp_attr{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = static_cast<uint8_t>(timeout);
    a.retry_cnt = static_cast<uint8_t>(retry);
    a.rnr_retry = 7;
    a.sq_psn = mine.psn;
    a.max_rd_atomic = 1;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
        return fail("RTS");
    // Both QPs are ready before either sends.
    char go = 1;
    if (write(tcp, &go, 1) != 1 || read(tcp, &go, 1) != 1)
        return fail("sync");
    std::printf("%s: sending\n", server ? "server" : "client");
    std::fflush(stdout);
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<long>(deadline_s * 1000));
    long errors = 0, received = 0;
    ibv_wc wc[16];
    if (server) {
        for (int i = 0; i < 2 * window; ++i) {
            ibv_recv_wr rw{};
            ibv_recv_wr *bad;
            rw.wr_id = static_cast<uint64_t>(i);
            ibv_post_recv(qp, &rw, &bad);
        }
        // Credits go back by RDMA WRITE of the count checked so far. Only one credit write is
        // in flight at a time (each signalled), so the send queue never fills and the last
        // count is always the one that lands.
        static uint64_t word = 0;
        ibv_mr *word_mr = ibv_reg_mr(pd, &word, sizeof(word), IBV_ACCESS_LOCAL_WRITE);
        bool credit_in_flight = false;
        uint64_t credited = 0;
        long spins = 0;
        while ((received < count || credited < static_cast<uint64_t>(count) || credit_in_flight) &&
               std::chrono::steady_clock::now() < deadline) {
            if (++spins % 4096 == 0) {
                char c;
                if (recv(tcp, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0) {
                    std::fprintf(stderr, "server: the client went away after %ld messages\n",
                                 received);
                    return 1;
                }
            }
            if (!credit_in_flight && credited < static_cast<uint64_t>(received)) {
                word = static_cast<uint64_t>(received);
                ibv_sge sge{reinterpret_cast<uint64_t>(&word), sizeof(word), word_mr->lkey};
                ibv_send_wr sw{};
                ibv_send_wr *sbad;
                sw.wr_id = word;
                sw.sg_list = &sge;
                sw.num_sge = 1;
                sw.opcode = IBV_WR_RDMA_WRITE;
                sw.send_flags = IBV_SEND_SIGNALED;
                sw.wr.rdma.remote_addr = theirs.addr;
                sw.wr.rdma.rkey = theirs.rkey;
                if (ibv_post_send(qp, &sw, &sbad) != 0)
                    return fail("post credit");
                credit_in_flight = true;
            }
            const int got = ibv_poll_cq(cq, 16, wc);
            for (int i = 0; i < got; ++i) {
                if (wc[i].status != IBV_WC_SUCCESS) {
                    std::fprintf(stderr, "server: completion %s\n",
                                 ibv_wc_status_str(wc[i].status));
                    return 1;
                }
                if (wc[i].opcode == IBV_WC_RDMA_WRITE) {
                    credit_in_flight = false;
                    credited = wc[i].wr_id;
                    continue;
                }
                if (wc[i].opcode != IBV_WC_RECV_RDMA_WITH_IMM)
                    continue;
                const uint32_t seq = ntohl(wc[i].imm_data);
                const uint8_t *slot = ring.data() + (seq % static_cast<uint32_t>(window)) * size;
                Msg m;
                std::memcpy(&m, slot, sizeof(m));
                const uint32_t crc = static_cast<uint32_t>(
                    crc32(0, slot + sizeof(Msg), static_cast<uInt>(size - sizeof(Msg))));
                if (seq != static_cast<uint32_t>(received) || m.seq != seq || m.len != size ||
                    m.crc != crc || wc[i].byte_len != size) {
                    if (errors++ < 5)
                        std::fprintf(stderr,
                                     "server: message %ld: got seq %u (header %u), crc %s\n",
                                     received, seq, m.seq, m.crc == crc ? "ok" : "BAD");
                }
                ++received;
                ibv_recv_wr rw{};
                ibv_recv_wr *bad;
                ibv_post_recv(qp, &rw, &bad);
            }
        }
        ibv_dereg_mr(word_mr);
        std::printf("server: received %ld of %d messages, %ld errors\n", received, count, errors);
    } else {
        int posted = 0;
        long completed = 0;
        std::mt19937 rng(7);
        while (completed < count && std::chrono::steady_clock::now() < deadline) {
            const uint64_t c = __atomic_load_n(&credit, __ATOMIC_ACQUIRE);
            while (posted < count && posted < static_cast<int>(c) + window &&
                   posted - completed < window) {
                uint8_t *slot = staging.data() + (posted % window) * size;
                for (size_t b = sizeof(Msg); b < size; ++b)
                    slot[b] = static_cast<uint8_t>(rng());
                Msg m{static_cast<uint32_t>(posted), static_cast<uint32_t>(size),
                      static_cast<uint32_t>(
                          crc32(0, slot + sizeof(Msg), static_cast<uInt>(size - sizeof(Msg))))};
                std::memcpy(slot, &m, sizeof(m));
                ibv_sge sge{reinterpret_cast<uint64_t>(slot), static_cast<uint32_t>(size),
                            stage_mr->lkey};
                ibv_send_wr sw{};
                ibv_send_wr *bad;
                sw.wr_id = static_cast<uint64_t>(posted);
                sw.sg_list = &sge;
                sw.num_sge = 1;
                sw.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
                sw.send_flags = IBV_SEND_SIGNALED;
                sw.imm_data = htonl(static_cast<uint32_t>(posted));
                sw.wr.rdma.remote_addr = theirs.addr + (posted % window) * size;
                sw.wr.rdma.rkey = theirs.rkey;
                if (ibv_post_send(qp, &sw, &bad) != 0)
                    return fail("post");
                ++posted;
            }
            const int got = ibv_poll_cq(cq, 16, wc);
            for (int i = 0; i < got; ++i) {
                if (wc[i].status != IBV_WC_SUCCESS) {
                    std::fprintf(stderr, "client: completion %s\n",
                                 ibv_wc_status_str(wc[i].status));
                    return 1;
                }
                ++completed;
            }
        }
        // Wait for the last credits so the server has checked everything.
        while (__atomic_load_n(&credit, __ATOMIC_ACQUIRE) < static_cast<uint64_t>(count) &&
               std::chrono::steady_clock::now() < deadline) {
            usleep(1000);
        }
        received = static_cast<long>(completed);
        std::printf("client: %ld of %d writes completed, credit %lu\n", completed, count,
                    static_cast<unsigned long>(credit));
        if (credit < static_cast<uint64_t>(count))
            errors = 1;
    }
    // Tell the peer we are done, then tear down (QP -> CQ -> MR -> PD -> context).
    if (write(tcp, &go, 1) != 1 || read(tcp, &go, 1) != 1) {
    }
    close(tcp);
    ibv_destroy_qp(qp);
    ibv_destroy_cq(cq);
    ibv_dereg_mr(ring_mr);
    ibv_dereg_mr(stage_mr);
    ibv_dereg_mr(credit_mr);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    return received == count && errors == 0 ? 0 : 1;
}
