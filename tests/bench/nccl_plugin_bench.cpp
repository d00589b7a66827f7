// What the NCCL plugin adds to a message (issue 22): a ping-pong through the plugin's function
// table, driven as NCCL's proxy drives it (the receiver posts its next receive before it
// answers), against the same ping-pong of tl_write_msg between two clients of the same two
// sidecars (the tensorlane call the plugin is built on) and a plain loopback TCP ping-pong
// (what NCCL's Socket transport does per message), alternated round by round.
//
// A second table, the exchange: both ranks at once post a fresh receive, send one message and
// wait for both, as a step of a 2-rank collective does (NCCL posts a collective's receives when
// it starts, so the receiver's CTS is on the critical path unless the send goes eagerly);
// against the same exchange of tl_write_msg messages and of a loopback TCP connection.
//
// A third table with --stream MIB, the stream: both ranks at once send MIB in steps of
// --step BYTES (512 KiB, NCCL's Simple step) with 8 in flight each way (NCCL_STEPS), receives
// posted ahead, as a 2-rank collective's bulk does; GB/s per direction, against the same
// stream of tl_write + immediate (window 8, notifications counted) and a full-duplex loopback
// TCP stream. Where the plugin's bandwidth goes: the plugin, the sidecars or neither.
//
//   nccl_plugin_bench [--sizes 64,4096,65536,1048576] [--iters 2000] [--rounds 5]
//                     [--poll-mode adaptive|busy|event] [--chunk BYTES] [--integrity mac|none]
//                     [--eager-bytes N] (TENSORLANE_NCCL_EAGER_BYTES of both ranks; 0: off)
//                     [--eager-slots N] (TENSORLANE_NCCL_EAGER_SLOTS of both ranks)
//                     [--log-closes 1] (the plugin's comm close lines to stderr)
//                     [--yield 1] (a waiting rank yields its CPU between calls: for machines
//                     of few CPUs, where spinning ranks starve the sidecars)
//                     [--posted BYTES] (the exchange's receives: at least this size; default
//                     64 KiB, NCCL's LL step; 1048576 is NCCL's Simple slice)
//                     [--stream MIB] [--step BYTES] [--copy-threads N] (--sizes none: the
//                     stream alone)
//                     (TENSORLANE_NCCL_COPY_THREADS of both ranks)
//                     [--tag-threads N] [--connections N] ([tcp] of both sidecars)
//                     [--tag-spin-us N] (TENSORLANE_TAG_SPIN_US of both sidecars)
//                     [--tag-io 0|1] (TENSORLANE_TAG_SOCKET_IO of both sidecars: 0 keeps the
//                     socket copies of big chunks on the engine thread)
//                     [--in-place 1] (NCCL's host buffers are memory the sidecar reaches, as
//                     NCCL's cuMem host buffers: the plugin registers them in place, no shadows)
//                     [--modes 1,2,5,4,3,6,7,8] (only these of the round-trip and exchange
//                     measures, e.g. 4,5 to profile write_imm against msg; the others print 0:
//                     1 plugin, 2 msg+ack, 5 msg, 4 write_imm, 3 tcp, 6-8 the exchange's)
//                     [--allreduce BYTES,...] [--ring-step BYTES] (the ring, above)
//                     [--cpu 1] (with --stream: each sidecar thread's CPU time over the
//                     tl_write stream, from /proc/PID/task/TID/schedstat, as a share of the
//                     stream's wall time: which thread is the bottleneck)
//
// A fourth table with --allreduce BYTES[,BYTES...], the ring: the traffic of NCCL's 2-rank ring
// all_reduce of BYTES (what each rank sends: BYTES / 2 of reduce-scatter, then BYTES / 2 of
// all-gather, in messages of --ring-step bytes, 128 KiB by default as NCCL sends at 1 MiB), every
// receive posted ahead, and each all-gather message sent as soon as the reduce-scatter message
// it follows from has landed (without the GPU's reduction between); us per all_reduce and the
// algbw it would give, against the same pattern over one full-duplex loopback TCP connection
// (NCCL's Socket transport without the GPU). The plugin's and the sidecars' part of the
// collective's critical path, measured without the GPU's turns.
//
// Two sidecars over tcp on loopback; this process is rank 0, a forked child rank 1, each
// beside its own sidecar with the plugin dlopen'ed (host memory: NCCL's LL buffers). Prints
// per size the median round trip of each and the ratios plugin / write_msg, plugin / tcp. Run:
// build/release/tests/bench/nccl_plugin_bench (docs/nccl.md, "Measured").
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_support.hpp"
#include "tensorlane/nccl_net.h"
#include "tensorlane/tensorlane.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMax = 4 << 20;
constexpr int kTag = 7;
constexpr size_t kStreamDepth = 8;  // NCCL_STEPS: a connection's steps in flight
/// --posted: the exchange's receives are of this size when bigger than the message (NCCL's
/// Simple receives are a slice, 1 MiB with its default buffers, whatever the step sends).
size_t g_posted = 64 << 10;
/// --ring-step: the ring's message size (NCCL sends 128 KiB messages in a 1 MiB all_reduce).
size_t g_ring_step = 128 << 10;
/// --yield 1: a rank waiting in the exchange's and round trips' loops yields its CPU after each
/// call that found nothing (on a machine of few CPUs the sidecars' threads then get theirs).
bool g_yield = false;
/// --log-closes 1: the plugin's comm close lines (which path each message took) to stderr.
bool g_log_closes = false;
void logCloses(ncclDebugLogLevel, unsigned long, const char *, int, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (std::strstr(line, "closed") != nullptr) {
        std::fprintf(stderr, "%s\n", line);
    }
}

[[noreturn]] void die(const std::string &why) {
    std::fprintf(stderr, "nccl_plugin_bench: %s\n", why.c_str());
    std::exit(1);
}

struct Pipe {
    int fd[2] = {-1, -1};
    Pipe() {
        if (::pipe(fd) != 0) {
            die("pipe");
        }
    }
    void put(const void *p, size_t n) const {
        if (::write(fd[1], p, n) != static_cast<ssize_t>(n)) {
            die("pipe write");
        }
    }
    void get(void *p, size_t n) const {
        if (::read(fd[0], p, n) != static_cast<ssize_t>(n)) {
            die("pipe read");
        }
    }
};

/// One rank: the plugin beside the sidecar at `socket`, a send and a recv comm to the other
/// rank, one host buffer each way; and, for the baseline, a client of its own with an exposed
/// region.
class Rank {
public:
    /// Closes the comms (their close lines say which path each message took: --log-closes).
    ~Rank() {
        if (g_log_closes && net_ != nullptr) {
            net_->closeSend(send_);
            net_->closeRecv(recv_);
        }
    }
    Rank(const Rank &) = delete;
    Rank &operator=(const Rank &) = delete;
    /// `in_place`: NCCL's host buffers are memory the sidecar reaches (as NCCL's cuMem host
    /// buffers are on a GPU machine; here ranges of the plugin's own tl_alloc_host buffers), so
    /// the plugin registers them in place; else private memory, which it shadows.
    Rank(const std::string &socket, const std::string &peer_node, int me, const Pipe &out,
         const Pipe &in, bool in_place)
        : peer_node_(peer_node) {
        ::setenv("TENSORLANE_SOCKET", socket.c_str(), 1);
        void *lib = ::dlopen(TENSORLANE_NCCL_PLUGIN, RTLD_NOW | RTLD_LOCAL);
        if (lib == nullptr) {
            die(std::string("dlopen: ") + ::dlerror());
        }
        net_ = static_cast<ncclNet_v8_t *>(::dlsym(lib, "ncclNetPlugin_v8"));
        if (net_ == nullptr || net_->init(g_log_closes ? &logCloses : nullptr) != ncclSuccess) {
            die("the plugin's init failed");
        }
        // Each listens, swaps handles over the pipes, connects and accepts.
        char handle[NCCL_NET_HANDLE_MAXSIZE] = {}, theirs[NCCL_NET_HANDLE_MAXSIZE] = {};
        void *listen = nullptr;
        check(net_->listen(0, handle, &listen), "listen");
        out.put(handle, sizeof(handle));
        in.get(theirs, sizeof(theirs));
        const auto end = Clock::now() + std::chrono::seconds(30);
        while ((send_ == nullptr || recv_ == nullptr) && Clock::now() < end) {
            if (send_ == nullptr) {
                check(net_->connect(0, theirs, &send_, nullptr), "connect");
            }
            if (recv_ == nullptr) {
                check(net_->accept(listen, &recv_, nullptr), "accept");
            }
            std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
        if (send_ == nullptr || recv_ == nullptr) {
            die("no connection within 30 s");
        }
        if (in_place) {
            using ClientFn = tl_client *(*)();
            auto client = reinterpret_cast<ClientFn>(::dlsym(lib, "tensorlane_nccl_test_client"));
            void *sp = nullptr, *rp = nullptr;
            tl_region sr = 0, rr = 0;
            if (client == nullptr || client() == nullptr ||
                tl_alloc_host(client(), kMax, &sp, &sr) != TL_OK ||
                tl_alloc_host(client(), kMax, &rp, &rr) != TL_OK) {
                die("--in-place: no buffers from the plugin's client");
            }
            sbuf_ = static_cast<unsigned char *>(sp);
            rbuf_ = static_cast<unsigned char *>(rp);
        } else {
            own_s_.assign(kMax, 0);
            own_r_.assign(kMax, 0);
            sbuf_ = own_s_.data();
            rbuf_ = own_r_.data();
        }
        std::memset(sbuf_, me + 1, kMax);
        std::memset(rbuf_, 0, kMax);
        check(net_->regMr(send_, sbuf_, kMax, NCCL_PTR_HOST, &smr_), "regMr");
        check(net_->regMr(recv_, rbuf_, kMax, NCCL_PTR_HOST, &rmr_), "regMr");
        // The baseline's client.
        if (tl_connect(socket.c_str(), &c_) != TL_OK) {
            die(std::string("tl_connect: ") + tl_last_error());
        }
        void *p = nullptr;
        const std::string name = "npb-" + std::to_string(me);
        if (tl_alloc_host(c_, kMax, &p, &src_) != TL_OK ||
            tl_alloc_host(c_, kMax, &p, &dst_) != TL_OK || tl_expose(c_, dst_, name.c_str())) {
            die(std::string("baseline regions: ") + tl_last_error());
        }
        const std::string theirs_name = "npb-" + std::to_string(1 - me);
        while (tl_lookup(c_, peer_node_.c_str(), theirs_name.c_str(), &remote_, nullptr) != TL_OK) {
            if (Clock::now() > end) {
                die(std::string("tl_lookup: ") + tl_last_error());
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
    }

    /// Posts the receive of the next message (up to `bytes`, kMax by default).
    void *postRecv(size_t bytes = kMax) {
        void *data = rbuf_;
        int size = static_cast<int>(bytes);  // v8's sizes are ints
        int tag = kTag;
        void *req = nullptr;
        while (req == nullptr) {
            check(net_->irecv(recv_, 1, &data, &size, &tag, &rmr_, &req), "irecv");
        }
        return req;
    }
    void sendAndWait(size_t bytes) {
        void *req = nullptr;
        while (req == nullptr) {
            check(net_->isend(send_, sbuf_, static_cast<int>(bytes), kTag, smr_, &req), "isend");
            if (req == nullptr) {
                idle();
            }
        }
        waitDone(req);
    }
    /// A collective's step: a fresh receive, a send, both waited for. The receive is of NCCL's
    /// LL step (64 KiB: 512 KiB of LL buffer over NCCL_STEPS; --posted), or of the message if
    /// bigger.
    void exchange(size_t bytes) {
        void *recv = postRecv(std::max<size_t>(bytes, g_posted));
        sendAndWait(bytes);
        waitDone(recv);
    }
    /// The stream's bulk: `n` sends and `n` receives of `step` bytes, each side keeping
    /// kStreamDepth in flight and its receives posted ahead, driven from this one thread as
    /// NCCL's proxy drives them.
    void streamPlugin(size_t step, int n) {
        std::deque<void *> sends, recvs;
        int sent = 0, posted = 0, sends_done = 0, recvs_done = 0;
        while (sends_done < n || recvs_done < n) {
            if (posted < n && recvs.size() < kStreamDepth) {
                void *data = rbuf_ + static_cast<size_t>(posted % kStreamDepth) * step;
                int size = static_cast<int>(step), tag = kTag;
                void *req = nullptr;
                check(net_->irecv(recv_, 1, &data, &size, &tag, &rmr_, &req), "irecv");
                if (req != nullptr) {
                    recvs.push_back(req);
                    ++posted;
                }
            }
            if (sent < n && sends.size() < kStreamDepth) {
                void *req = nullptr;
                check(net_->isend(send_, sbuf_ + static_cast<size_t>(sent % kStreamDepth) * step,
                                  static_cast<int>(step), kTag, smr_, &req),
                      "isend");
                if (req != nullptr) {
                    sends.push_back(req);
                    ++sent;
                }
            }
            for (auto *q : {&sends, &recvs}) {
                if (q->empty()) {
                    continue;
                }
                int done = 0, size = 0;
                check(net_->test(q->front(), &done, &size), "test");
                if (done != 0) {
                    q->pop_front();
                    ++(q == &sends ? sends_done : recvs_done);
                }
            }
        }
    }
    /// The ring's all_reduce of `bytes` (see the file's head): 2k messages of `step` each way,
    /// receives posted ahead and sends in flight at most kStreamDepth (NCCL_STEPS) each, k
    /// reduce-scatter sends at once and all-gather send i once reduce-scatter receive i is in.
    void ringPlugin(size_t bytes, size_t step) {
        const size_t k = std::max<size_t>(1, bytes / 2 / step);
        const size_t n = 2 * k;
        const size_t slot = kMax / kStreamDepth;  // each receive's room, reused in turn
        const size_t posted = std::max(step, std::min(g_posted, slot));
        std::vector<void *> recvs(n, nullptr), sends(n, nullptr);
        std::vector<bool> recv_done(n, false);
        size_t next_recv = 0, recvs_done = 0, sent = 0, sends_done = 0;
        while (recvs_done < n || sends_done < n) {
            // Receives in order, at most kStreamDepth not yet done (NCCL posts a step's
            // receive once its buffer slot is free).
            while (next_recv < n && next_recv - recvs_done < kStreamDepth) {
                void *data = rbuf_ + (next_recv % kStreamDepth) * slot;
                int size = static_cast<int>(posted), tag = kTag;
                check(net_->irecv(recv_, 1, &data, &size, &tag, &rmr_, &recvs[next_recv]), "irecv");
                if (recvs[next_recv] == nullptr) {
                    break;
                }
                ++next_recv;
            }
            // Reduce-scatter messages go at once; all-gather message i after receive i landed.
            while (sent < n && sent - sends_done < kStreamDepth &&
                   (sent < k || recv_done[sent - k])) {
                void *req = nullptr;
                check(net_->isend(send_, sbuf_ + (sent % kStreamDepth) * step,
                                  static_cast<int>(step), kTag, smr_, &req),
                      "isend");
                if (req == nullptr) {
                    break;
                }
                sends[sent++] = req;
            }
            bool progress = false;
            // Both complete in order (one tag, one comm each way).
            int done = 0, size = 0;
            if (recvs_done < next_recv) {
                check(net_->test(recvs[recvs_done], &done, &size), "test");
                if (done != 0) {
                    recv_done[recvs_done++] = true;
                    progress = true;
                }
            }
            if (sends_done < sent) {
                done = 0;
                check(net_->test(sends[sends_done], &done, &size), "test");
                if (done != 0) {
                    ++sends_done;
                    progress = true;
                }
            }
            if (!progress) {
                idle();
            }
        }
    }
    /// The same bulk as tl_write + immediate into the other rank's region, window kStreamDepth,
    /// and the other rank's `n` notifications taken.
    void streamWrite(size_t step, int n) {
        std::deque<tl_ticket> inflight;
        int sent = 0, got = 0;
        while (sent < n || !inflight.empty() || got < n) {
            if (sent < n && inflight.size() < kStreamDepth) {
                const uint64_t off = static_cast<uint64_t>(sent % kStreamDepth) * step;
                tl_ticket t = 0;
                if (tl_write(c_, src_, off, remote_, off, step, 5, &t) != TL_OK) {
                    die(std::string("tl_write: ") + tl_last_error());
                }
                inflight.push_back(t);
                ++sent;
            }
            if (!inflight.empty()) {
                int done = 0;
                if (tl_test(c_, inflight.front(), &done) != TL_OK) {
                    die(std::string("tl_write: ") + tl_last_error());
                }
                if (done != 0) {
                    inflight.pop_front();
                }
            }
            tl_notification note{};
            if (got < n && tl_wait_notification(c_, &note, 0) == TL_OK) {
                ++got;
            }
        }
    }
    void waitDone(void *req) {
        int done = 0, size = 0;
        while (done == 0) {
            check(net_->test(req, &done, &size), "test");
            if (done == 0) {
                idle();
            }
        }
    }
    /// A wait loop's call found nothing: --yield gives the CPU to the sidecars' threads.
    static void idle() {
        if (g_yield) {
            ::sched_yield();
        }
    }
    /// The baseline: one tl_write_msg of `bytes` into the other rank's region.
    void writeMsg(size_t bytes, bool wait = true) {
        tl_send_opts o{};
        unsigned char payload[40] = {};
        o.payload = payload;
        o.payload_bytes = sizeof(payload);  // the plugin's DATA payload is this size
        tl_ticket t = 0;
        if (tl_write_msg(c_, src_, 0, remote_, 0, bytes, &o, &t) != TL_OK) {
            die(std::string("tl_write_msg: ") + tl_last_error());
        }
        // Polled with tl_test, as the plugin's test() does (tl_wait would sleep).
        for (int done = 0; wait && done == 0;) {
            if (tl_test(c_, t, &done) != TL_OK) {
                die(std::string("tl_write_msg: ") + tl_last_error());
            }
        }
        if (!wait) {
            pending_.push_back(t);
        }
    }
    void waitMsg() {
        tl_message m{};
        while (tl_wait_message(c_, &m, 0) != TL_OK) {
        }
    }
    /// `tensorlane bench --test lat`'s step: a tl_write with an immediate whose ticket is
    /// reaped later (reap()), not waited for.
    void writeImm(size_t bytes) {
        tl_ticket t = 0;
        if (tl_write(c_, src_, 0, remote_, 0, bytes, 5, &t) != TL_OK) {
            die(std::string("tl_write: ") + tl_last_error());
        }
        pending_.push_back(t);
    }
    void waitNotification() {
        tl_notification n{};
        while (tl_wait_notification(c_, &n, 0) != TL_OK) {
        }
    }
    void reap() {
        for (tl_ticket t : pending_) {
            if (tl_wait(c_, t, 20000) != TL_OK) {
                die(std::string("tl_wait: ") + tl_last_error());
            }
        }
        pending_.clear();
    }

private:
    static void check(ncclResult_t r, const char *what) {
        if (r != ncclSuccess) {
            die(std::string(what) + " failed: " + std::to_string(r));
        }
    }
    std::string peer_node_;
    ncclNet_v8_t *net_ = nullptr;
    void *send_ = nullptr, *recv_ = nullptr, *smr_ = nullptr, *rmr_ = nullptr;
    unsigned char *sbuf_ = nullptr, *rbuf_ = nullptr;
    std::vector<unsigned char> own_s_, own_r_;  ///< the buffers when not in place
    tl_client *c_ = nullptr;
    tl_region src_ = 0, dst_ = 0;
    tl_remote remote_ = 0;
    std::vector<tl_ticket> pending_;
};

/// A loopback TCP connection (TCP_NODELAY, as NCCL's Socket transport sets it).
class Tcp {
public:
    /// The listening end, before the fork.
    Tcp() {
        lfd_ = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof(a);
        if (::bind(lfd_, reinterpret_cast<sockaddr *>(&a), sizeof(a)) != 0 ||
            ::listen(lfd_, 1) != 0 ||
            ::getsockname(lfd_, reinterpret_cast<sockaddr *>(&a), &len) != 0) {
            die("tcp listen");
        }
        port_ = a.sin_port;
    }
    void connectTo() {
        fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = port_;
        if (::connect(fd_, reinterpret_cast<sockaddr *>(&a), sizeof(a)) != 0) {
            die("tcp connect");
        }
        noDelay();
    }
    void acceptOne() {
        fd_ = ::accept(lfd_, nullptr, nullptr);
        if (fd_ < 0) {
            die("tcp accept");
        }
        noDelay();
    }
    void send(const unsigned char *p, size_t n) const {
        while (n > 0) {
            const ssize_t k = ::send(fd_, p, n, 0);
            if (k <= 0) {
                die("tcp send");
            }
            p += k;
            n -= static_cast<size_t>(k);
        }
    }
    /// Sends `bytes` from `out` while it receives `bytes` into `in` (full duplex, one thread).
    void duplex(const unsigned char *out, unsigned char *in, size_t bytes, size_t step) const {
        size_t sent = 0, got = 0;
        while (sent < bytes || got < bytes) {
            duplexTurn(out, in, step, bytes, bytes, &sent, &got);
        }
    }
    /// The ring's all_reduce of `bytes` over this connection: the reduce-scatter's bytes go at
    /// once, each all-gather message once the reduce-scatter message it follows from is in.
    void ring(const unsigned char *out, unsigned char *in, size_t bytes, size_t step) const {
        const size_t k = std::max<size_t>(1, bytes / 2 / step);
        const size_t total = 2 * k * step;
        size_t sent = 0, got = 0;
        while (sent < total || got < total) {
            // Sendable: the reduce-scatter, and an all-gather message per one received.
            const size_t allowed = k * step + std::min(got / step, k) * step;
            duplexTurn(out, in, k * step, allowed, total, &sent, &got);
        }
    }
    void recv(unsigned char *p, size_t n) const {
        while (n > 0) {
            const ssize_t k = ::recv(fd_, p, n, 0);
            if (k <= 0) {
                die("tcp recv");
            }
            p += k;
            n -= static_cast<size_t>(k);
        }
    }

private:
    /// One non-blocking send (of at most `send_to` bytes in all) and one receive (of at most
    /// `total`) of a full-duplex transfer whose buffers `out` and `in` repeat every `period`.
    void duplexTurn(const unsigned char *out, unsigned char *in, size_t period, size_t send_to,
                    size_t total, size_t *sent, size_t *got) const {
        if (*sent < send_to) {
            const size_t n = std::min(period - *sent % period, send_to - *sent);
            const ssize_t k = ::send(fd_, out + *sent % period, n, MSG_DONTWAIT);
            if (k > 0) {
                *sent += static_cast<size_t>(k);
            } else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
                die("tcp send");
            }
        }
        if (*got < total) {
            const size_t n = std::min(period - *got % period, total - *got);
            const ssize_t k = ::recv(fd_, in + *got % period, n, MSG_DONTWAIT);
            if (k > 0) {
                *got += static_cast<size_t>(k);
            } else if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
                die("tcp recv");
            }
        }
    }
    void noDelay() const {
        int one = 1;
        ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        // The exchange sends before it receives at both ends: buffers that hold a message.
        int bytes = 8 << 20;
        ::setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
        ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
    }
    int lfd_ = -1, fd_ = -1;
    in_port_t port_ = 0;
};

struct Command {
    int mode;  // 0 stop, 1 plugin, 2 write_msg + ticket, 3 tcp, 4 write + immediate, 5 write_msg,
               // 6 plugin exchange, 7 write_msg exchange, 8 tcp exchange, 9 plugin stream,
               // 10 write stream, 11 tcp stream (bytes: the step; iters: steps), 12 plugin ring,
               // 13 tcp ring (bytes: the all_reduce's; iters: all_reduces)
    uint64_t bytes;
    int iters;
};

/// Both ranks' part of a stream command (9 plugin, 10 tl_write, 11 tcp).
void runStream(Rank &r, const Tcp &tcp, const Command &c, std::vector<unsigned char> &buf) {
    if (c.mode == 9) {
        r.streamPlugin(c.bytes, c.iters);
    } else if (c.mode == 10) {
        r.streamWrite(c.bytes, c.iters);
    } else {
        std::vector<unsigned char> out(c.bytes, 9);
        tcp.duplex(out.data(), buf.data(), c.bytes * static_cast<size_t>(c.iters), c.bytes);
    }
}

/// Rank 1: answers every message with one of the same size, for `iters` messages a command.
/// Like NCCL's proxy it keeps its next receive posted while it answers.
void echo(Rank &r, const Tcp &tcp, const Pipe &commands, const Pipe &acks) {
    std::vector<unsigned char> buf(kMax);
    for (;;) {
        Command c{};
        commands.get(&c, sizeof(c));
        if (c.mode == 0) {
            return;
        }
        if (c.mode == 1) {
            void *req = r.postRecv();
            acks.put(&c, 1);
            for (int i = 0; i < c.iters; ++i) {
                r.waitDone(req);
                req = i + 1 < c.iters ? r.postRecv() : nullptr;
                r.sendAndWait(c.bytes);
            }
        } else if (c.mode == 2) {
            acks.put(&c, 1);
            for (int i = 0; i < c.iters; ++i) {
                r.waitMsg();
                r.writeMsg(c.bytes);
            }
        } else if (c.mode >= 9 && c.mode <= 11) {
            acks.put(&c, 1);
            runStream(r, tcp, c, buf);
        } else if (c.mode == 12 || c.mode == 13) {
            acks.put(&c, 1);
            std::vector<unsigned char> out(kMax, 9);
            for (int i = 0; i < c.iters; ++i) {
                if (c.mode == 12) {
                    r.ringPlugin(c.bytes, g_ring_step);
                } else {
                    tcp.ring(out.data(), buf.data(), c.bytes, g_ring_step);
                }
            }
        } else if (c.mode == 6) {
            acks.put(&c, 1);
            for (int i = 0; i < c.iters; ++i) {
                r.exchange(c.bytes);
            }
        } else if (c.mode == 7) {
            acks.put(&c, 1);
            for (int i = 0; i < c.iters; ++i) {
                r.writeMsg(c.bytes, false);
                r.waitMsg();
                if (i % 64 == 63) {
                    r.reap();
                }
            }
            r.reap();
        } else if (c.mode == 8) {
            acks.put(&c, 1);
            for (int i = 0; i < c.iters; ++i) {
                tcp.send(buf.data(), c.bytes);
                tcp.recv(buf.data(), c.bytes);
            }
        } else if (c.mode == 4 || c.mode == 5) {
            acks.put(&c, 1);
            for (int i = 0; i < c.iters; ++i) {
                if (c.mode == 4) {
                    r.waitNotification();
                    r.writeImm(c.bytes);
                } else {
                    r.waitMsg();
                    r.writeMsg(c.bytes, false);
                }
                if (i % 64 == 63) {
                    r.reap();
                }
            }
            r.reap();
        } else {
            acks.put(&c, 1);
            for (int i = 0; i < c.iters; ++i) {
                tcp.recv(buf.data(), c.bytes);
                tcp.send(buf.data(), c.bytes);
            }
        }
        acks.put(&c, 1);
    }
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

std::vector<uint64_t> parseSizes(const std::string &s) {
    std::vector<uint64_t> out;
    std::stringstream in(s);
    std::string item;
    while (std::getline(in, item, ',')) {
        out.push_back(std::stoull(item));
    }
    return out;
}

}  // namespace

/// CPU nanoseconds of each thread of `pid`, by thread id, with its name.
using ThreadTimes = std::map<std::string, std::pair<std::string, uint64_t>>;
ThreadTimes threadTimes(pid_t pid) {
    ThreadTimes out;
    const std::string dir = "/proc/" + std::to_string(pid) + "/task";
    for (const auto &e : std::filesystem::directory_iterator(dir)) {
        std::ifstream sched(e.path() / "schedstat"), comm(e.path() / "comm");
        uint64_t ns = 0;
        std::string name;
        if (sched >> ns && std::getline(comm, name)) {
            out[e.path().filename().string()] = {name, ns};
        }
    }
    return out;
}

/// Per thread name: CPU time between the two samples as a share of `wall_s` (1.00: one CPU busy
/// the whole time), threads of one name summed and counted.
void printThreadShares(const char *node, const ThreadTimes &before, const ThreadTimes &after,
                       double wall_s) {
    std::map<std::string, std::pair<double, int>> by_name;
    for (const auto &[tid, v] : after) {
        const auto it = before.find(tid);
        const uint64_t was = it == before.end() ? 0 : it->second.second;
        auto &slot = by_name[v.first];
        slot.first += static_cast<double>(v.second - was) / 1e9 / wall_s;
        ++slot.second;
    }
    std::printf("  %s threads over the write stream (CPU share of %.3f s):", node, wall_s);
    for (const auto &[name, v] : by_name) {
        std::printf(" %s x%d %.2f;", name.c_str(), v.second, v.first);
    }
    std::printf("\n");
}

int main(int argc, char **argv) {
    std::vector<uint64_t> sizes = {64, 4096, 65536, 1 << 20};
    int iters = 2000, rounds = 5;
    std::string poll = "adaptive", chunk, integrity, eager = "default", copy_threads = "default";
    std::string tag_threads, connections;
    bool cpu = false, in_place = false;
    uint64_t stream_mib = 0, step = 512 << 10;
    std::vector<uint64_t> ring_sizes;
    std::vector<uint64_t> modes = {1, 2, 5, 4, 3, 6, 7, 8};
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i], v = argv[i + 1];
        if (a == "--sizes") {
            sizes = v == "none" ? std::vector<uint64_t>{} : parseSizes(v);
        } else if (a == "--modes") {
            modes = parseSizes(v);
        } else if (a == "--iters") {
            iters = std::stoi(v);
        } else if (a == "--rounds") {
            rounds = std::stoi(v);
        } else if (a == "--poll-mode") {
            poll = v;
        } else if (a == "--chunk") {
            chunk = std::to_string(std::stoull(v));
        } else if (a == "--integrity") {
            integrity = v == "none" ? "none" : "mac";
        } else if (a == "--tag-threads") {
            tag_threads = std::to_string(std::stoul(v));
        } else if (a == "--connections") {
            connections = std::to_string(std::stoul(v));
        } else if (a == "--in-place") {
            in_place = v != "0";
        } else if (a == "--tag-io") {
            ::setenv("TENSORLANE_TAG_SOCKET_IO", v.c_str(), 1);
        } else if (a == "--tag-spin-us") {
            ::setenv("TENSORLANE_TAG_SPIN_US", std::to_string(std::stoul(v)).c_str(), 1);
        } else if (a == "--cpu") {
            cpu = v != "0";
        } else if (a == "--stream") {
            stream_mib = std::stoull(v);
        } else if (a == "--step") {
            step = std::stoull(v);
        } else if (a == "--allreduce") {
            ring_sizes = parseSizes(v);
        } else if (a == "--ring-step") {
            g_ring_step = std::stoull(v);
        } else if (a == "--copy-threads") {
            ::setenv("TENSORLANE_NCCL_COPY_THREADS", std::to_string(std::stoul(v)).c_str(), 1);
            copy_threads = v;
        } else if (a == "--yield") {
            g_yield = v != "0";
        } else if (a == "--log-closes") {
            g_log_closes = v != "0";
        } else if (a == "--posted") {
            g_posted = std::min<size_t>(std::stoull(v), kMax);
        } else if (a == "--eager-slots") {
            ::setenv("TENSORLANE_NCCL_EAGER_SLOTS", std::to_string(std::stoul(v)).c_str(), 1);
        } else if (a == "--eager-bytes") {
            ::setenv("TENSORLANE_NCCL_EAGER_BYTES", std::to_string(std::stoul(v)).c_str(), 1);
            eager = v;
        } else {
            die("unknown option " + a);
        }
    }
    for (uint64_t s : sizes) {
        if (s > kMax) {
            die("sizes up to " + std::to_string(kMax));
        }
    }
    for (uint64_t s : ring_sizes) {
        if (g_ring_step == 0 || s > kMax ||
            std::max<uint64_t>(1, s / 2 / g_ring_step) * 2 * g_ring_step > kMax) {
            die("--allreduce up to " + std::to_string(kMax) + " bytes, --ring-step from 1");
        }
    }
    if (step == 0 || step * kStreamDepth > kMax) {
        die("--step from 1 to " + std::to_string(kMax / kStreamDepth));
    }
    const int pa = tlbench::freePort(), pb = tlbench::freePort();
    auto opts = [&](const char *name, int port, const char *peer, int peer_port) {
        tlbench::SidecarOptions o;
        o.name = name;
        o.poll_mode = poll;
        o.listen = "127.0.0.1:" + std::to_string(port);
        // (The generated config ends in its [security] table.)
        o.extra = (integrity.empty() ? "" : "tcp_integrity = \"" + integrity + "\"\n") + "[tcp]\n" +
                  (chunk.empty() ? "" : "chunk_bytes = " + chunk + "\n") +
                  (tag_threads.empty() ? "" : "tag_threads = " + tag_threads + "\n") +
                  (connections.empty() ? "" : "connections_per_peer = " + connections + "\n") +
                  std::string("[fabric]\ntransport = \"tcp\"\n[[peers]]\nname = \"") + peer +
                  "\"\naddress = \"127.0.0.1:" + std::to_string(peer_port) + "\"\n";
        return o;
    };
    tlbench::Sidecar a(opts("node-a", pa, "node-b", pb));
    tlbench::Sidecar b(opts("node-b", pb, "node-a", pa));
    Pipe up, down, commands, acks;  // handles child->parent, parent->child; then commands
    Tcp tcp;
    const pid_t child = tlbench::forkTied();
    if (child == 0) {
        tcp.connectTo();
        Rank r(b.socket(), "node-a", 1, up, down, in_place);
        echo(r, tcp, commands, acks);
        if (std::getenv("TENSORLANE_NCCL_TRACE_FILE") != nullptr) {
            std::exit(0);  // the plugin writes rank 1's trace file at exit (docs/nccl.md)
        }
        std::_Exit(0);
    }
    tcp.acceptOne();
    Rank r(a.socket(), "node-b", 0, down, up, in_place);
    std::vector<unsigned char> buf(kMax, 3);
    std::vector<std::array<double, 4>> exchanges;
    std::printf(
        "%10s %10s %10s %10s %10s %10s %7s %7s %7s  (round trips in us, medians of %d "
        "rounds x %d; poll %s%s%s)\n",
        "bytes", "plugin", "msg+ack", "msg", "write_imm", "tcp", "/msg", "/tcp", "imm/tcp", rounds,
        iters, poll.c_str(), chunk.empty() ? "" : ", chunk_bytes ", chunk.c_str());
    for (uint64_t bytes : sizes) {
        std::vector<double> got[9];
        for (int round = 0; round < rounds; ++round) {
            for (uint64_t m64 : modes) {
                const int mode = static_cast<int>(m64);
                if (mode < 1 || mode > 8) {
                    continue;
                }
                Command c{mode, bytes, iters};
                commands.put(&c, sizeof(c));
                char ack = 0;
                acks.get(&ack, 1);
                std::vector<double> rt;
                rt.reserve(static_cast<size_t>(iters));
                void *req = mode == 1 ? r.postRecv() : nullptr;
                for (int i = 0; i < iters; ++i) {
                    if ((mode == 4 || mode == 5 || mode == 7) && i % 64 == 63) {
                        r.reap();  // outside the timed part, as tensorlane bench does
                    }
                    const auto t0 = Clock::now();
                    if (mode == 1) {
                        r.sendAndWait(bytes);
                        r.waitDone(req);
                        req = i + 1 < iters ? r.postRecv() : nullptr;
                    } else if (mode == 6) {
                        r.exchange(bytes);
                    } else if (mode == 7) {
                        r.writeMsg(bytes, false);
                        r.waitMsg();
                    } else if (mode == 8) {
                        tcp.send(buf.data(), bytes);
                        tcp.recv(buf.data(), bytes);
                    } else if (mode == 2) {
                        r.writeMsg(bytes);
                        r.waitMsg();
                    } else if (mode == 4) {
                        r.writeImm(bytes);
                        r.waitNotification();
                    } else if (mode == 5) {
                        r.writeMsg(bytes, false);
                        r.waitMsg();
                    } else {
                        tcp.send(buf.data(), bytes);
                        tcp.recv(buf.data(), bytes);
                    }
                    rt.push_back(
                        std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
                }
                acks.get(&ack, 1);
                r.reap();
                got[mode].push_back(median(rt));
            }
        }
        const double p = median(got[1]), w = median(got[2]), t = median(got[3]),
                     im = median(got[4]), m = median(got[5]);
        std::printf("%10llu %10.2f %10.2f %10.2f %10.2f %10.2f %7.2f %7.2f %7.2f\n",
                    static_cast<unsigned long long>(bytes), p, w, m, im, t, w > 0 ? p / w : 0,
                    t > 0 ? p / t : 0, t > 0 ? im / t : 0);
        const double xp = median(got[6]), xm = median(got[7]), xt = median(got[8]);
        exchanges.push_back({static_cast<double>(bytes), xp, xm, xt});
        std::fflush(stdout);
    }
    std::printf(
        "\n%10s %10s %10s %10s %7s %7s  (exchange: both ranks post a receive, send, wait "
        "both; us per step, medians; eager %s)\n",
        "bytes", "plugin", "msg", "tcp", "/msg", "/tcp", eager.c_str());
    for (const auto &x : exchanges) {
        std::printf("%10.0f %10.2f %10.2f %10.2f %7.2f %7.2f\n", x[0], x[1], x[2], x[3],
                    x[2] > 0 ? x[1] / x[2] : 0, x[3] > 0 ? x[1] / x[3] : 0);
    }
    if (stream_mib != 0) {
        const int steps = static_cast<int>(std::max<uint64_t>(1, (stream_mib << 20) / step));
        std::vector<double> gbs[12];
        for (int round = 0; round < rounds; ++round) {
            for (int mode : {9, 10, 11}) {
                Command c{mode, step, steps};
                commands.put(&c, sizeof(c));
                char ack = 0;
                acks.get(&ack, 1);
                const bool sample = cpu && mode == 10;
                const ThreadTimes before_a = sample ? threadTimes(a.pid()) : ThreadTimes{};
                const ThreadTimes before_b = sample ? threadTimes(b.pid()) : ThreadTimes{};
                const ThreadTimes before_r0 = sample ? threadTimes(::getpid()) : ThreadTimes{};
                const ThreadTimes before_r1 = sample ? threadTimes(child) : ThreadTimes{};
                const auto t0 = Clock::now();
                runStream(r, tcp, c, buf);
                acks.get(&ack, 1);  // the other rank's direction is done too
                const double s = std::chrono::duration<double>(Clock::now() - t0).count();
                if (sample) {
                    printThreadShares("node-a", before_a, threadTimes(a.pid()), s);
                    printThreadShares("node-b", before_b, threadTimes(b.pid()), s);
                    printThreadShares("rank 0", before_r0, threadTimes(::getpid()), s);
                    printThreadShares("rank 1", before_r1, threadTimes(child), s);
                }
                r.reap();
                gbs[mode].push_back(static_cast<double>(step) * steps / s / 1e9);
            }
        }
        const double p = median(gbs[9]), w = median(gbs[10]), t = median(gbs[11]);
        std::printf(
            "\n%10s %10s %10s %10s %7s %7s  (stream: both ranks send %llu MiB at once in steps "
            "of %llu bytes, %zu in flight; GB/s per direction, medians of %d rounds; eager %s, "
            "copy threads %s, host buffers %s)\n",
            "step", "plugin", "write", "tcp", "/write", "/tcp",
            static_cast<unsigned long long>(stream_mib), static_cast<unsigned long long>(step),
            kStreamDepth, rounds, eager.c_str(), copy_threads.c_str(),
            in_place ? "in place" : "shadowed");
        std::printf("%10llu %10.3f %10.3f %10.3f %7.2f %7.2f\n",
                    static_cast<unsigned long long>(step), p, w, t, w > 0 ? p / w : 0,
                    t > 0 ? p / t : 0);
    }
    if (!ring_sizes.empty()) {
        std::printf(
            "\n%10s %10s %10s %7s %10s %10s  (ring: NCCL's 2-rank all_reduce traffic in %zu-byte "
            "messages, without the GPU; us per all_reduce, medians of %d rounds x %d; algbw "
            "GB/s)\n",
            "bytes", "plugin", "tcp", "/tcp", "plugin GB/s", "tcp GB/s", g_ring_step, rounds,
            iters);
        for (uint64_t bytes : ring_sizes) {
            std::vector<double> got[14];
            std::vector<unsigned char> out(kMax, 9);
            for (int round = 0; round < rounds; ++round) {
                for (int mode : {12, 13}) {
                    Command c{mode, bytes, iters};
                    commands.put(&c, sizeof(c));
                    char ack = 0;
                    acks.get(&ack, 1);
                    std::vector<double> us;
                    for (int i = 0; i < iters; ++i) {
                        const auto t0 = Clock::now();
                        if (mode == 12) {
                            r.ringPlugin(bytes, g_ring_step);
                        } else {
                            tcp.ring(out.data(), buf.data(), bytes, g_ring_step);
                        }
                        us.push_back(
                            std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
                    }
                    acks.get(&ack, 1);
                    got[mode].push_back(median(us));
                }
            }
            const double p = median(got[12]), t = median(got[13]);
            std::printf("%10llu %10.2f %10.2f %7.2f %10.3f %10.3f\n",
                        static_cast<unsigned long long>(bytes), p, t, t > 0 ? p / t : 0,
                        p > 0 ? static_cast<double>(bytes) / p / 1e3 : 0,
                        t > 0 ? static_cast<double>(bytes) / t / 1e3 : 0);
            std::fflush(stdout);
        }
    }
    Command stop{0, 0, 0};
    commands.put(&stop, sizeof(stop));
    int status = 0;
    ::waitpid(child, &status, 0);
    return 0;
}
