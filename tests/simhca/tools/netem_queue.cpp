// netem_queue: a userspace stand-in for tc-netem (which this kernel lacks: no sch_netem
// module) on RoCE traffic. An nftables rule hands packets to NFQUEUE
// (`udp dport 4791 meta mark != 0x1 queue num N bypass`); this program delays, reorders,
// duplicates and drops them:
//   --delay-ms D      hold every packet D ms before it goes on (the verdict is deferred)
//   --reorder-pct P   hold P% of packets --reorder-ms (default 2) while the rest pass: those
//                     arrive after packets sent later, as netem's "reorder" does
//   --dup-pct P       send P% twice: the original, and a copy through a raw socket marked 0x1
//                     (so the rule does not queue it again)
//   --loss-pct P      drop P%
//   --seconds S       exit after S seconds (default: run until SIGTERM/SIGINT)
// Prints what it did on exit. Deferred verdicts keep the kernel's packet, so nothing is
// rebuilt and the ICRC stays valid.
//
//   usage: netem_queue --queue N [options]
#include <arpa/inet.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <string>

namespace {

using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_stop = 0;

struct Held {
    uint32_t id;
    Clock::time_point release;
};

struct State {
    nfq_q_handle *qh = nullptr;
    int raw = -1;
    double delay_ms = 0, reorder_pct = 0, reorder_ms = 2, dup_pct = 0, loss_pct = 0;
    std::mt19937 rng{12345};
    std::deque<Held> held;  // in release order for the plain delay; scanned for reorders
    long seen = 0, dropped = 0, delayed = 0, reordered = 0, duplicated = 0;
};

bool chance(State &s, double pct) {
    return pct > 0 && std::uniform_real_distribution<double>(0, 100)(s.rng) < pct;
}

int onPacket(nfq_q_handle *qh, nfgenmsg *, nfq_data *nfa, void *data) {
    auto &s = *static_cast<State *>(data);
    const nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(nfa);
    if (ph == nullptr) {
        return 0;
    }
    const uint32_t id = ntohl(ph->packet_id);
    ++s.seen;
    if (chance(s, s.loss_pct)) {
        ++s.dropped;
        return nfq_set_verdict(qh, id, NF_DROP, 0, nullptr);
    }
    if (chance(s, s.dup_pct)) {
        unsigned char *payload = nullptr;
        const int len = nfq_get_payload(nfa, &payload);
        if (len >= 20) {
            sockaddr_in to{};
            to.sin_family = AF_INET;
            std::memcpy(&to.sin_addr, payload + 16, 4);
            if (sendto(s.raw, payload, static_cast<size_t>(len), 0,
                       reinterpret_cast<sockaddr *>(&to), sizeof(to)) == len) {
                ++s.duplicated;
            }
        }
    }
    const auto now = Clock::now();
    if (chance(s, s.reorder_pct)) {
        ++s.reordered;
        s.held.push_back(
            {id, now + std::chrono::microseconds(static_cast<long>(s.reorder_ms * 1000))});
        return 0;
    }
    if (s.delay_ms > 0) {
        ++s.delayed;
        s.held.push_back(
            {id, now + std::chrono::microseconds(static_cast<long>(s.delay_ms * 1000))});
        return 0;
    }
    return nfq_set_verdict(qh, id, NF_ACCEPT, 0, nullptr);
}

void releaseDue(State &s) {
    const auto now = Clock::now();
    for (auto it = s.held.begin(); it != s.held.end();) {
        if (it->release <= now) {
            nfq_set_verdict(s.qh, it->id, NF_ACCEPT, 0, nullptr);
            it = s.held.erase(it);
        } else {
            ++it;
        }
    }
}

}  // namespace

int main(int argc, char **argv) {
    State s;
    int queue = -1;
    double seconds = 0;
    for (int i = 1; i < argc; ++i) {
        const std::string k = argv[i];
        const double v = i + 1 < argc ? std::atof(argv[i + 1]) : 0;
        if (k == "--queue") {
            queue = static_cast<int>(v);
        } else if (k == "--delay-ms") {
            s.delay_ms = v;
        } else if (k == "--reorder-pct") {
            s.reorder_pct = v;
        } else if (k == "--reorder-ms") {
            s.reorder_ms = v;
        } else if (k == "--dup-pct") {
            s.dup_pct = v;
        } else if (k == "--loss-pct") {
            s.loss_pct = v;
        } else if (k == "--seconds") {
            seconds = v;
        } else {
            std::fprintf(stderr,
                         "usage: netem_queue --queue N [--delay-ms D] [--reorder-pct P "
                         "[--reorder-ms D]] [--dup-pct P] [--loss-pct P] [--seconds S]\n");
            return 2;
        }
        ++i;
    }
    if (queue < 0) {
        std::fprintf(stderr, "netem_queue: --queue is required\n");
        return 2;
    }
    std::signal(SIGTERM, [](int) { g_stop = 1; });
    std::signal(SIGINT, [](int) { g_stop = 1; });
    s.raw = socket(AF_INET, SOCK_RAW, IPPROTO_RAW);
    const int mark = 1;
    if (s.raw < 0 || setsockopt(s.raw, SOL_SOCKET, SO_MARK, &mark, sizeof(mark)) != 0) {
        std::perror("netem_queue: raw socket");
        return 1;
    }
    nfq_handle *h = nfq_open();
    if (h == nullptr) {
        std::perror("netem_queue: nfq_open");
        return 1;
    }
    s.qh = nfq_create_queue(h, static_cast<uint16_t>(queue), onPacket, &s);
    if (s.qh == nullptr || nfq_set_mode(s.qh, NFQNL_COPY_PACKET, 0xffff) < 0) {
        std::perror("netem_queue: nfq_create_queue");
        return 1;
    }
    nfq_set_queue_maxlen(s.qh, 8192);
    const int fd = nfq_fd(h);
    std::printf("netem_queue: queue %d ready\n", queue);
    std::fflush(stdout);
    const auto end = Clock::now() + std::chrono::milliseconds(static_cast<long>(seconds * 1000));
    char buf[0x10000 + 4096];
    while (!g_stop && (seconds <= 0 || Clock::now() < end)) {
        pollfd p{fd, POLLIN, 0};
        long wait_ns = 100'000'000;
        for (const Held &held : s.held) {
            wait_ns = std::min<long>(
                wait_ns, std::max<long>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                               held.release - Clock::now())
                                               .count()));
        }
        const timespec ts{0, wait_ns};
        if (ppoll(&p, 1, &ts, nullptr) > 0) {
            const ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
            if (n > 0) {
                nfq_handle_packet(h, buf, static_cast<int>(n));
            }
        }
        releaseDue(s);
    }
    for (const Held &held : s.held) {
        nfq_set_verdict(s.qh, held.id, NF_ACCEPT, 0, nullptr);
    }
    nfq_destroy_queue(s.qh);
    nfq_close(h);
    std::printf(
        "netem_queue: %ld packets, %ld dropped, %ld delayed, %ld reordered, %ld duplicated\n",
        s.seen, s.dropped, s.delayed, s.reordered, s.duplicated);
    return 0;
}
