// udp_baseline: the plain-UDP yardsticks for the simulator's speed (docs/simhca.md, "Speed"),
// run between two processes on the same loopback addresses as the perftest runs:
//   pingpong: one datagram of --size bytes each way, blocking recv; prints the one-way
//             latency (RTT/2, as perftest's ib_write_lat reports) in microseconds.
//   stream:   --bytes in datagrams of --size bytes (the RoCE path MTU) with sendmmsg(2) batches,
//             received with recvmmsg(2); prints what arrived per second, in MiB/s.
//
//   --cross-cpu pins the two processes to CPUs 0 and 1. Two applications that both spin (as
//             perftest's do) end up on different CPUs, so every hand-off between them is a
//             cross-CPU wake-up; this measures that floor. Without it the scheduler may run
//             both ends of a blocking ping-pong on one CPU.
//
//   usage: udp_baseline pingpong|stream [--size N] [--iters N] [--bytes N]
//                       [--a 127.0.0.2] [--b 127.0.0.3] [--busy] [--cross-cpu]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

int boundSocket(const char *ip, uint16_t port) {
    const int fd = socket(AF_INET, SOCK_DGRAM, 0);
    const int buf = 32 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof(buf));
    setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buf, sizeof(buf));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    inet_pton(AF_INET, ip, &a.sin_addr);
    if (bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)) != 0) {
        std::perror("bind");
        std::exit(2);
    }
    return fd;
}

sockaddr_in address(const char *ip, uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    inet_pton(AF_INET, ip, &a.sin_addr);
    return a;
}

ssize_t recvOne(int fd, void *buf, size_t n, bool busy) {
    for (;;) {
        const ssize_t r = recv(fd, buf, n, busy ? MSG_DONTWAIT : 0);
        if (r >= 0 || (errno != EAGAIN && errno != EINTR)) {
            return r;
        }
    }
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr,
                     "usage: udp_baseline pingpong|stream [--size N] [--iters N] [--bytes N] "
                     "[--a IP] [--b IP] [--busy]\n");
        return 2;
    }
    const std::string mode = argv[1];
    size_t size = mode == "stream" ? 4096 : 8;
    long iters = 10000;
    size_t bytes = size_t{1} << 30;
    const char *ip_a = "127.0.0.2";
    const char *ip_b = "127.0.0.3";
    bool busy = false;
    bool cross_cpu = false;
    for (int i = 2; i < argc; ++i) {
        const std::string k = argv[i];
        if (k == "--busy") {
            busy = true;
        } else if (k == "--cross-cpu") {
            cross_cpu = true;
        } else if (i + 1 < argc && k == "--size") {
            size = std::strtoull(argv[++i], nullptr, 0);
        } else if (i + 1 < argc && k == "--iters") {
            iters = std::strtol(argv[++i], nullptr, 0);
        } else if (i + 1 < argc && k == "--bytes") {
            bytes = std::strtoull(argv[++i], nullptr, 0);
        } else if (i + 1 < argc && k == "--a") {
            ip_a = argv[++i];
        } else if (i + 1 < argc && k == "--b") {
            ip_b = argv[++i];
        } else {
            std::fprintf(stderr, "udp_baseline: unknown argument %s\n", k.c_str());
            return 2;
        }
    }
    constexpr uint16_t kPort = 19791;
    const int fa = boundSocket(ip_a, kPort);
    const int fb = boundSocket(ip_b, kPort);
    const sockaddr_in to_a = address(ip_a, kPort);
    const sockaddr_in to_b = address(ip_b, kPort);
    std::vector<char> buf(std::max<size_t>(size, 65536));
    const pid_t child = fork();
    auto pin = [cross_cpu](int cpu) {
        if (cross_cpu) {
            cpu_set_t set;
            CPU_ZERO(&set);
            CPU_SET(cpu, &set);
            sched_setaffinity(0, sizeof(set), &set);
        }
    };
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        pin(1);
        close(fa);
        if (mode == "pingpong") {
            for (long i = 0; i < iters + 100; ++i) {
                const ssize_t n = recvOne(fb, buf.data(), buf.size(), busy);
                sendto(fb, buf.data(), static_cast<size_t>(n), 0,
                       reinterpret_cast<const sockaddr *>(&to_a), sizeof(to_a));
            }
        } else {
            // Receive until the sender's end marker (a 1-byte datagram), then report.
            constexpr int kBatch = 64;
            std::vector<char> rx(kBatch * 65536);
            mmsghdr msgs[kBatch];
            iovec iov[kBatch];
            size_t got = 0;
            Clock::time_point first{};
            Clock::time_point last{};
            for (bool done = false; !done;) {
                for (int i = 0; i < kBatch; ++i) {
                    iov[i] = iovec{rx.data() + i * 65536, 65536};
                    msgs[i] = mmsghdr{};
                    msgs[i].msg_hdr.msg_iov = &iov[i];
                    msgs[i].msg_hdr.msg_iovlen = 1;
                }
                const int n = recvmmsg(fb, msgs, kBatch, MSG_WAITFORONE, nullptr);
                for (int i = 0; i < n; ++i) {
                    if (msgs[i].msg_len == 1) {
                        done = true;
                        continue;
                    }
                    if (got == 0) {
                        first = Clock::now();
                    }
                    got += msgs[i].msg_len;
                    last = Clock::now();
                }
            }
            const double s = std::chrono::duration<double>(last - first).count();
            std::printf("udp stream: %zu-byte datagrams, %.1f MiB received in %.3f s: %.1f MiB/s\n",
                        size, got / 1048576.0, s, s > 0 ? got / 1048576.0 / s : 0.0);
            std::fflush(stdout);
        }
        _exit(0);
    }
    close(fb);
    pin(0);
    if (mode == "pingpong") {
        std::vector<double> us;
        for (long i = 0; i < iters + 100; ++i) {
            const auto t0 = Clock::now();
            sendto(fa, buf.data(), size, 0, reinterpret_cast<const sockaddr *>(&to_b),
                   sizeof(to_b));
            recvOne(fa, buf.data(), buf.size(), busy);
            if (i >= 100) {  // warm-up
                us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
                             2);
            }
        }
        std::sort(us.begin(), us.end());
        double sum = 0;
        for (double v : us) {
            sum += v;
        }
        std::printf(
            "udp pingpong%s%s: %zu bytes, %ld iterations, one-way (RTT/2) usec: min %.2f "
            "typical %.2f avg %.2f p99 %.2f\n",
            busy ? " busy" : "", cross_cpu ? " cross-cpu" : "", size, iters, us.front(),
            us[us.size() / 2], sum / us.size(), us[us.size() * 99 / 100]);
    } else {
        constexpr int kBatch = 32;
        mmsghdr msgs[kBatch];
        iovec iov[kBatch];
        for (int i = 0; i < kBatch; ++i) {
            iov[i] = iovec{buf.data(), size};
            msgs[i] = mmsghdr{};
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_name = const_cast<sockaddr_in *>(&to_b);
            msgs[i].msg_hdr.msg_namelen = sizeof(to_b);
        }
        for (size_t sent = 0; sent < bytes;) {
            const int n = sendmmsg(fa, msgs, kBatch, 0);
            if (n > 0) {
                sent += static_cast<size_t>(n) * size;
            }
        }
        usleep(20000);
        for (int i = 0; i < 20; ++i) {
            sendto(fa, buf.data(), 1, 0, reinterpret_cast<const sockaddr *>(&to_b), sizeof(to_b));
        }
    }
    int status = 0;
    waitpid(child, &status, 0);
    return 0;
}
