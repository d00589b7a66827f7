// The NCCL net plugin driven as NCCL's proxy thread drives it, without NCCL: the built
// libnccl-net-tensorlane.so loaded with dlopen, its ncclNetPlugin_v8 (and v9) table called by
// two processes, each beside its own sidecar (tcp on loopback, or verbs on the simulated HCA):
// listen/connect/accept polled until they give a comm, host memory registered, every message
// size from 0 bytes to 16 MiB + 3 into receive buffers larger than the message, grouped
// receives matched by tag in any order, requests tested out of order, and a peer killed
// mid-transfer ending every request with an error instead of a hang.
#include <dlfcn.h>
#include <elf.h>
#include <gtest/gtest.h>
#include <link.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "../sidecar/harness.hpp"
#include "tensorlane/nccl_net.h"
#include "tensorlane/tensorlane.h"

using namespace tltest;

namespace {

using Clock = std::chrono::steady_clock;

/// The simulated NIC's PCI function (mksysfs.sh --pci).
constexpr const char *kNicPci = "0000:03:00.0";

/// Two sidecars (node-a, node-b) that list each other, over `transport`.
struct Pair {
    TempDir dir;
    std::unique_ptr<Sidecar> a, b;
    explicit Pair(const std::string &transport) {
        const std::string key = dir.file("peer.key");
        writeFile(key, keyText('9'), 0600);
        const uint16_t pa = freePort(), pb = freePort();
        auto opts = [&](const char *name, uint16_t port, const char *peer, uint16_t peer_port,
                        int ip) {
            SidecarOptions o;
            o.name = name;
            o.listen = "127.0.0.1:" + std::to_string(port);
            o.key_file = key;
            o.tcp = kFastFailureTcp;
            o.transport = transport;
            o.rdma_ip = uniqueLoopback(ip);
            o.fabric = "timeout = 14\nretry_cnt = 3\n";
            o.rdma_pci = kNicPci;  // the simulated NIC on a PCI bus, as a real one is
            o.peers.push_back({peer, "127.0.0.1:" + std::to_string(peer_port)});
            return o;
        };
        a = std::make_unique<Sidecar>(opts("node-a", pa, "node-b", pb, 41));
        b = std::make_unique<Sidecar>(opts("node-b", pb, "node-a", pa, 42));
    }
    bool ready() const { return a->ready() && b->ready(); }
    std::string logs() const { return a->log().substr(0, 6000) + b->log().substr(0, 6000); }
};

/// The plugin loaded in this (child) process, beside the sidecar at `socket`.
struct Plugin {
    void *lib = nullptr;
    ncclNet_v8_t *v8 = nullptr;
    ncclNet_v9_t *v9 = nullptr;
    bool open(const std::string &socket) {
        ::setenv("TENSORLANE_SOCKET", socket.c_str(), 1);
        lib = ::dlopen(TENSORLANE_NCCL_PLUGIN, RTLD_NOW | RTLD_LOCAL);
        if (lib == nullptr) {
            std::fprintf(stderr, "dlopen: %s\n", ::dlerror());
            return false;
        }
        v8 = static_cast<ncclNet_v8_t *>(::dlsym(lib, "ncclNetPlugin_v8"));
        v9 = static_cast<ncclNet_v9_t *>(::dlsym(lib, "ncclNetPlugin_v9"));
        return v8 != nullptr && v9 != nullptr && v8->init(logger) == ncclSuccess;
    }
    static void logger(ncclDebugLogLevel level, unsigned long, const char *, int, const char *fmt,
                       ...) {
        char line[1024];
        va_list ap;
        va_start(ap, fmt);
        std::vsnprintf(line, sizeof(line), fmt, ap);
        va_end(ap);
        if (level <= NCCL_LOG_WARN) {
            std::fprintf(stderr, "%s\n", line);
        }
        if (std::strstr(line, "trace: ") != nullptr) {
            ++traceLines();
        }
        if (std::strstr(line, " closed: ") != nullptr ||
            std::strstr(line, "process totals: ") != nullptr) {
            closed().push_back(line);  // the comm's counts (which path each send took)
        }
    }
    /// The trace lines NCCL's log got in this process so far (TENSORLANE_NCCL_TRACE=1).
    static int &traceLines() {
        static int n = 0;
        return n;
    }
    /// The plugin's "... comm N ... closed: counts" lines in this process so far.
    static std::vector<std::string> &closed() {
        static std::vector<std::string> lines;
        return lines;
    }
    /// From the last "process totals" line: host buffers registered in place and shadowed.
    static bool hostBuffers(unsigned long long *in_place, unsigned long long *shadowed) {
        for (auto it = closed().rbegin(); it != closed().rend(); ++it) {
            const char *at = std::strstr(it->c_str(), "host buffers registered in place ");
            if (at != nullptr &&
                std::sscanf(at, "host buffers registered in place %llu, shadowed %llu", in_place,
                            shadowed) == 2) {
                return true;
            }
        }
        return false;
    }
    /// Whether this process registered its one host buffer in place (`in_place`) or shadowed;
    /// else says what it did, as `who`.
    static bool oneHostBuffer(bool in_place, const char *who) {
        unsigned long long direct = 0, shadowed = 0;
        if (hostBuffers(&direct, &shadowed) && direct == (in_place ? 1u : 0u) &&
            shadowed == (in_place ? 0u : 1u)) {
            return true;
        }
        std::fprintf(stderr, "%s's host buffers: %llu in place, %llu shadowed\n", who, direct,
                     shadowed);
        return false;
    }
    /// A host buffer of `bytes` for NCCL_PTR_HOST: this process's memory (the plugin shadows
    /// it), or with `in_place` a tl_alloc_host buffer of the plugin's own client (memory
    /// tl_register shares, as NCCL's cuMem host buffers are: the plugin uses it in place).
    unsigned char *hostBuffer(size_t bytes, bool in_place, std::vector<unsigned char> *own) {
        if (!in_place) {
            own->assign(bytes, 0);
            return own->data();
        }
        using ClientFn = tl_client *(*)();
        auto fn = reinterpret_cast<ClientFn>(::dlsym(lib, "tensorlane_nccl_test_client"));
        void *p = nullptr;
        tl_region r = 0;
        if (fn == nullptr || fn() == nullptr || tl_alloc_host(fn(), bytes, &p, &r) != TL_OK) {
            return nullptr;
        }
        return static_cast<unsigned char *>(p);
    }
    /// The last send comm's counts: eager sends, sends into a CTS, RTS sent, sends that
    /// waited, MiB copied; false if none (the whole line must parse: tests/nccl/
    /// torch_collectives.py reads the same lines).
    static bool sendCounts(unsigned long long *eager, unsigned long long *direct,
                           unsigned long long *rts, unsigned long long *waited = nullptr,
                           double *copied_mib = nullptr, unsigned long long *timed = nullptr,
                           double *timed_us = nullptr) {
        for (auto it = closed().rbegin(); it != closed().rend(); ++it) {
            const char *at = std::strstr(it->c_str(), " closed: ");
            unsigned long long crossed = 0, w = 0, t = 0;
            double wait_ms = 0, mib = 0, copy_ms = 0, t_us = 0;
            if (it->find("send comm") != std::string::npos && at != nullptr &&
                std::sscanf(at,
                            " closed: %llu sends eager, %llu into a CTS, %llu RTS, %llu CTS "
                            "crossed by an eager send; %llu sends waited %lf ms in all; copied "
                            "%lf MiB in %lf ms; %llu writes of 128 KiB and more took %lf us on "
                            "average from tl_write to their end",
                            eager, direct, rts, &crossed, &w, &wait_ms, &mib, &copy_ms, &t,
                            &t_us) == 10) {
                if (waited != nullptr) {
                    *waited = w;
                }
                if (copied_mib != nullptr) {
                    *copied_mib = mib;
                }
                if (timed != nullptr) {
                    *timed = t;
                }
                if (timed_us != nullptr) {
                    *timed_us = t_us;
                }
                return true;
            }
        }
        return false;
    }
};

/// Polls `step` (an entry point that may give nothing yet) until `*out` is set: false on an
/// error or after `timeout`.
bool pollFor(const std::function<ncclResult_t()> &step, void **out,
             std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    const auto end = Clock::now() + timeout;
    while (Clock::now() < end) {
        if (step() != ncclSuccess) {
            return false;
        }
        if (*out != nullptr) {
            return true;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return false;
}

/// Tests `req` until done: the result of the last test (ncclSuccess with *done set).
ncclResult_t waitDone(ncclNet_v8_t *net, void *req, int *sizes,
                      std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    const auto end = Clock::now() + timeout;
    int done = 0;
    while (Clock::now() < end) {
        if (ncclResult_t r = net->test(req, &done, sizes); r != ncclSuccess) {
            return r;
        }
        if (done) {
            return ncclSuccess;
        }
    }
    return ncclInProgress;
}

/// The message sizes of the exchange: 0 bytes to 16 MiB + 3.
const std::vector<int> kSizes = {
    0, 1, 3, 255, 4096, 4097, 65535, 1 << 20, (1 << 20) + 1, 4 << 20, (16 << 20) + 3};
constexpr size_t kBuffer = (16 << 20) + 4096;  // bigger than the biggest message

/// Pipes for the handle (receiver to sender) and a go signal.
struct Pipe {
    int fd[2] = {-1, -1};
    Pipe() { EXPECT_EQ(::pipe(fd), 0); }
    ~Pipe() {
        ::close(fd[0]);
        ::close(fd[1]);
    }
    bool put(const void *p, size_t n) { return ::write(fd[1], p, n) == static_cast<ssize_t>(n); }
    bool get(void *p, size_t n) { return ::read(fd[0], p, n) == static_cast<ssize_t>(n); }
};

/// Opens the plugin beside `socket`, listens, gives the handle to each of `to` and polls accept
/// as NCCL does: the receive comm, null on a failure.
void *listenAndAccept(Plugin &p, const std::string &socket, std::initializer_list<Pipe *> to) {
    char h[NCCL_NET_HANDLE_MAXSIZE] = {};
    void *l = nullptr, *rc = nullptr;
    if (!p.open(socket) || p.v8->listen(0, h, &l) != ncclSuccess) {
        return nullptr;
    }
    for (Pipe *pipe : to) {
        if (!pipe->put(h, sizeof(h))) {
            return nullptr;
        }
    }
    return pollFor([&] { return p.v8->accept(l, &rc, nullptr); }, &rc) ? rc : nullptr;
}

/// Opens the plugin beside `socket`, takes the listener's handle from `from` and polls connect:
/// the send comm, null on a failure.
void *connectWith(Plugin &p, const std::string &socket, Pipe &from) {
    char h[NCCL_NET_HANDLE_MAXSIZE];
    void *sc = nullptr;
    if (!p.open(socket) || !from.get(h, sizeof(h))) {
        return nullptr;
    }
    return pollFor([&] { return p.v8->connect(0, h, &sc, nullptr); }, &sc) ? sc : nullptr;
}

/// The receiving rank: listens, accepts, posts `kSizes` one at a time and checks each, then a
/// grouped receive of three tags, then four requests in flight tested last to first.
int receiver(const std::string &socket, Pipe &handle_pipe, bool v9, int speed,
             const std::string &pci_path, bool in_place = false) {
    Plugin p;
    if (!p.open(socket)) {
        return 2;
    }
    ncclNet_v8_t *net = p.v8;
    ncclNetProperties_v8_t props{};
    if (net->getProperties(0, &props) != ncclSuccess || props.maxRecvs < 3 ||
        (props.ptrSupport & NCCL_PTR_HOST) == 0) {
        return 3;
    }
    const std::string got_pci = props.pciPath == nullptr ? "" : props.pciPath;
    if (got_pci != pci_path) {
        std::fprintf(stderr, "pciPath '%s', want '%s'\n", got_pci.c_str(), pci_path.c_str());
        return 3;
    }
    if (props.speed != speed) {
        std::fprintf(stderr, "speed %d Mb/s, want %d\n", props.speed, speed);
        return 3;
    }
    char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
    void *lcomm = nullptr, *rcomm = nullptr;
    if (net->listen(0, handle, &lcomm) != ncclSuccess || !handle_pipe.put(handle, sizeof(handle))) {
        return 4;
    }
    if (!pollFor([&] { return net->accept(lcomm, &rcomm, nullptr); }, &rcomm)) {
        return 5;
    }
    net->closeListen(lcomm);  // as NCCL does once connected
    std::vector<unsigned char> own;
    unsigned char *const base = p.hostBuffer(kBuffer, in_place, &own);
    if (base == nullptr) {
        return 6;
    }
    const std::span<unsigned char> buf(base, kBuffer);
    void *mh = nullptr;
    if (net->regMr(rcomm, buf.data(), buf.size(), NCCL_PTR_HOST, &mh) != ncclSuccess) {
        return 6;
    }
    std::vector<unsigned char> expect(kBuffer);
    for (size_t i = 0; i < kSizes.size(); ++i) {
        std::memset(buf.data(), 0, buf.size());
        void *data[1] = {buf.data() + 64};
        int size = static_cast<int>(kBuffer - 64);
        int tag = 7;
        void *req = nullptr;
        const auto post = [&] {
            if (v9) {
                size_t s9 = static_cast<size_t>(size);
                return p.v9->irecv(rcomm, 1, data, &s9, &tag, &mh, &req);
            }
            return net->irecv(rcomm, 1, data, &size, &tag, &mh, &req);
        };
        if (!pollFor(post, &req)) {
            return 10;
        }
        int got = -1;
        if (waitDone(net, req, &got) != ncclSuccess) {
            std::fprintf(stderr, "receive of %d bytes did not end\n", kSizes[i]);
            return 11;
        }
        if (got != kSizes[i]) {
            std::fprintf(stderr, "received %d bytes, want %d\n", got, kSizes[i]);
            return 12;
        }
        fillRandom(expect.data(), static_cast<size_t>(got), 100 + i);
        if (std::memcmp(buf.data() + 64, expect.data(), static_cast<size_t>(got)) != 0) {
            std::fprintf(stderr, "the %d bytes differ\n", got);
            return 13;
        }
        for (size_t k = 64 + static_cast<size_t>(got); k < buf.size(); ++k) {
            if (buf[k] != 0) {
                std::fprintf(stderr, "byte %zu past a %d-byte message written\n", k, got);
                return 14;
            }
        }
    }
    // A grouped receive: three buffers, tags 1..3, the sender sends them 3, 1, 2.
    {
        void *data[3] = {buf.data(), buf.data() + (1 << 20), buf.data() + (2 << 20)};
        int sizes[3] = {1 << 20, 1 << 20, 1 << 20};
        int tags[3] = {1, 2, 3};
        void *mhs[3] = {mh, mh, mh};
        void *req = nullptr;
        if (!pollFor([&] { return net->irecv(rcomm, 3, data, sizes, tags, mhs, &req); }, &req)) {
            return 20;
        }
        int got[3] = {-1, -1, -1};
        if (waitDone(net, req, got) != ncclSuccess) {
            return 21;
        }
        for (int t = 0; t < 3; ++t) {
            fillRandom(expect.data(), 1000 + t, 500 + t);
            if (got[t] != 1000 + t ||
                std::memcmp(data[t], expect.data(), static_cast<size_t>(got[t])) != 0) {
                std::fprintf(stderr, "grouped entry %d: %d bytes\n", t, got[t]);
                return 22;
            }
        }
    }
    // Four receives in flight, tested last to first.
    {
        void *reqs[4] = {};
        for (int k = 0; k < 4; ++k) {
            void *data[1] = {buf.data() + k * (1 << 20)};
            int size = 1 << 20, tag = 9;
            if (!pollFor([&] { return net->irecv(rcomm, 1, data, &size, &tag, &mh, &reqs[k]); },
                         &reqs[k])) {
                return 30;
            }
        }
        for (int k = 3; k >= 0; --k) {
            int got = -1;
            if (waitDone(net, reqs[k], &got) != ncclSuccess || got != 4096 * (k + 1)) {
                return 31;
            }
            fillRandom(expect.data(), static_cast<size_t>(got), 900 + k);
            if (std::memcmp(buf.data() + k * (1 << 20), expect.data(), static_cast<size_t>(got)) !=
                0) {
                return 32;
            }
        }
    }
    if (net->deregMr(rcomm, mh) != ncclSuccess || net->closeRecv(rcomm) != ncclSuccess) {
        return 40;
    }
    return Plugin::oneHostBuffer(in_place, "receiver") ? 0 : 41;
}

/// The sending rank: the other half of receiver(). `eager` >= 0: the sends that must have gone
/// eagerly (the rest into a CTS), from the plugin's counts at close.
int sender(const std::string &socket, Pipe &handle_pipe, bool v9, int eager = -1,
           bool in_place = false) {
    Plugin p;
    if (!p.open(socket)) {
        return 2;
    }
    ncclNet_v8_t *net = p.v8;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    if (!handle_pipe.get(handle, sizeof(handle))) {
        return 3;
    }
    void *scomm = nullptr;
    if (!pollFor([&] { return net->connect(0, handle, &scomm, nullptr); }, &scomm)) {
        return 4;
    }
    std::vector<unsigned char> own;
    unsigned char *const base = p.hostBuffer(kBuffer, in_place, &own);
    if (base == nullptr) {
        return 5;
    }
    const std::span<unsigned char> src(base, kBuffer);
    void *mh = nullptr;
    if (net->regMr(scomm, src.data(), src.size(), NCCL_PTR_HOST, &mh) != ncclSuccess) {
        return 5;
    }
    const auto send = [&](void *data, int size, int tag, void **req) {
        return pollFor(
            [&] {
                return v9 ? p.v9->isend(scomm, data, static_cast<size_t>(size), tag, mh, req)
                          : net->isend(scomm, data, size, tag, mh, req);
            },
            req);
    };
    for (size_t i = 0; i < kSizes.size(); ++i) {
        fillRandom(src.data() + 8, static_cast<size_t>(kSizes[i]), 100 + i);
        void *req = nullptr;
        int got = -1;
        if (!send(src.data() + 8, kSizes[i], 7, &req) || waitDone(net, req, &got) != ncclSuccess ||
            got != kSizes[i]) {
            std::fprintf(stderr, "send of %d bytes: %d\n", kSizes[i], got);
            return 10;
        }
    }
    {
        void *reqs[3] = {};
        for (int t : {3, 1, 2}) {
            unsigned char *at = src.data() + t * (2 << 20);
            fillRandom(at, 1000 + (t - 1), 500 + (t - 1));
            if (!send(at, 1000 + (t - 1), t, &reqs[t - 1])) {
                return 20;
            }
        }
        for (void *r : reqs) {
            if (waitDone(net, r, nullptr) != ncclSuccess) {
                return 21;
            }
        }
    }
    {
        void *reqs[4] = {};
        for (int k = 0; k < 4; ++k) {
            unsigned char *at = src.data() + k * (1 << 20);
            fillRandom(at, 4096 * (k + 1), 900 + k);
            if (!send(at, 4096 * (k + 1), 9, &reqs[k])) {
                return 30;
            }
        }
        for (int k = 3; k >= 0; --k) {
            if (waitDone(net, reqs[k], nullptr) != ncclSuccess) {
                return 31;
            }
        }
    }
    if (net->deregMr(scomm, mh) != ncclSuccess || net->closeSend(scomm) != ncclSuccess) {
        return 40;
    }
    unsigned long long eager_sends = 0, direct = 0, rts = 0;
    if (!Plugin::oneHostBuffer(in_place, "sender")) {
        return 42;
    }
    double copied = -1;
    if (in_place && eager == 0 &&
        (!Plugin::sendCounts(&eager_sends, &direct, &rts, nullptr, &copied) || copied != 0)) {
        std::fprintf(stderr, "in place with no eager ring, the sender copied %.3f MiB\n", copied);
        return 43;
    }
    if (eager >= 0) {
        const int total = static_cast<int>(kSizes.size()) + 3 + 4;
        if (!Plugin::sendCounts(&eager_sends, &direct, &rts) ||
            eager_sends != static_cast<unsigned long long>(eager) ||
            direct != static_cast<unsigned long long>(total - eager)) {
            std::fprintf(stderr, "sends: %llu eager, %llu into a CTS; want %d eager of %d\n",
                         eager_sends, direct, eager, total);
            return 41;
        }
    }
    // Every send of 128 KiB and more went into a CTS and was timed (1 MiB, 1 MiB + 1, 4 MiB,
    // 16 MiB + 3): the close line says how many, and a time for them.
    unsigned long long timed = 0;
    double timed_us = 0;
    if (!Plugin::sendCounts(&eager_sends, &direct, &rts, nullptr, nullptr, &timed, &timed_us) ||
        timed != static_cast<unsigned long long>(std::count_if(
                     kSizes.begin(), kSizes.end(), [](int n) { return n >= (128 << 10); })) ||
        timed_us <= 0) {
        std::fprintf(stderr, "timed sends: %llu, %.1f us on average\n", timed, timed_us);
        return 44;
    }
    return 0;
}

/// What the plugin beside `receiver` must tell NCCL over `transport`: the speed (the simulated
/// port's rate, "100 Gb/sec (4X EDR)", over verbs; NCCL Socket's 10 Gb/s over tcp, no port to
/// ask) and the NIC's PCI function (its topology places the NIC by it, for GPUDirect: the verbs
/// sidecar's device as this process resolves it; none over tcp). False (`*pci` the path) when
/// that device cannot be resolved.
bool expectedDevice(const std::string &transport, const Sidecar &receiver, int *speed,
                    std::string *pci) {
    *speed = transport == "verbs" ? 100000 : 10000;
    pci->clear();
    if (transport == "verbs") {
        char real[PATH_MAX];
        *pci = receiver.sysfsRoot() + "/devices/pci0000:00/0000:00:01.0/" + kNicPci;
        if (::realpath(pci->c_str(), real) == nullptr) {
            return false;
        }
        *pci = real;
    }
    return true;
}

class NcclPlugin : public ::testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(Transports, NcclPlugin, ::testing::Values("tcp", "verbs"),
                         [](const auto &param_info) { return param_info.param; });

/// The eager path's settings in both ranks (environment of the plugin's process).
struct EagerMode {
    const char *name;
    const char *bytes;   ///< TENSORLANE_NCCL_EAGER_BYTES (null: the default ring)
    const char *prefer;  ///< TENSORLANE_NCCL_EAGER_PREFER
    int eager;           ///< sends that must go eagerly (-1: it depends on timing)
};
void useEagerMode(const EagerMode &m) {
    if (m.bytes != nullptr) {
        ::setenv("TENSORLANE_NCCL_EAGER_BYTES", m.bytes, 1);
    }
    if (m.prefer != nullptr) {
        ::setenv("TENSORLANE_NCCL_EAGER_PREFER", m.prefer, 1);
    }
}

TEST_P(NcclPlugin, EverySizeGroupedAndOutOfOrderArriveWhole) {
    Pair nodes(GetParam());
    ASSERT_TRUE(nodes.ready()) << nodes.logs();
    // The default (sends up to 64 KiB that find no CTS go eagerly, the rest wait for theirs);
    // eager preferred even where a CTS is there (the receiver copies into buffers it posted
    // already, and the sender drops those CTSes as stale); no eager ring (CTS only).
    // With eager preferred, every send of at most 64 KiB goes eagerly: the seven of kSizes up
    // to 65535 bytes, the three grouped and the four in flight.
    const EagerMode modes[] = {{"default", nullptr, nullptr, -1},
                               {"prefer eager", nullptr, "1", 14},
                               {"no eager ring", "0", nullptr, 0}};
    for (const EagerMode &mode : modes) {
        for (bool v9 : {false, true}) {
            if (v9 && mode.bytes == nullptr && mode.prefer != nullptr) {
                continue;
            }
            SCOPED_TRACE(std::string(mode.name) + (v9 ? ", v9" : ", v8"));
            Pipe handle;
            int speed = 0;
            std::string pci;
            ASSERT_TRUE(expectedDevice(GetParam(), *nodes.b, &speed, &pci)) << pci;
            // The v9 runs copy NCCL's host buffers (sizes up to 16 MiB + 3) with two helper
            // threads, the v8 runs on the calling thread alone (the default on this machine's
            // CPUs may be either).
            const char *helpers = v9 ? "2" : "0";
            const pid_t r = forkClient([&] {
                useEagerMode(mode);
                ::setenv("TENSORLANE_NCCL_COPY_THREADS", helpers, 1);
                return receiver(nodes.b->socket(), handle, v9, speed, pci);
            });
            const pid_t s = forkClient([&] {
                useEagerMode(mode);
                ::setenv("TENSORLANE_NCCL_COPY_THREADS", helpers, 1);
                return sender(nodes.a->socket(), handle, v9, mode.eager);
            });
            EXPECT_EQ(waitChild(s), 0) << nodes.logs();
            EXPECT_EQ(waitChild(r), 0) << nodes.logs();
        }
    }
}

/// Whether the loaded plugin's dynamic section says DF_1_NODELETE (linked -z nodelete).
bool markedNoDelete() {
    bool marked = false;
    ::dl_iterate_phdr(
        [](dl_phdr_info *info, size_t, void *out) {
            if (info->dlpi_name == nullptr ||
                std::strstr(info->dlpi_name, "libnccl-net-tensorlane") == nullptr) {
                return 0;
            }
            for (int i = 0; i < info->dlpi_phnum; ++i) {
                if (info->dlpi_phdr[i].p_type != PT_DYNAMIC) {
                    continue;
                }
                const auto *d = reinterpret_cast<const ElfW(Dyn) *>(info->dlpi_addr +
                                                                    info->dlpi_phdr[i].p_vaddr);
                for (; d->d_tag != DT_NULL; ++d) {
                    if (d->d_tag == DT_FLAGS_1 && (d->d_un.d_val & DF_1_NODELETE) != 0) {
                        *static_cast<bool *>(out) = true;
                    }
                }
            }
            return 1;
        },
        &marked);
    return marked;
}

// NCCL unloads the plugin (dlclose) when its last communicator is destroyed, and loads it
// again for the next. The plugin's threads (the trace's watchdog, which wakes once a second; the
// copy helpers) outlive the unload, so the library must stay mapped: it is linked -z nodelete.
// (On the GPU machine, NCCL 2.28 with TENSORLANE_NCCL_TRACE=1, a rank died of SIGSEGV within a
// second of NCCL's "Unloading plugin tensorlane"; code run from unmapped pages is the likely
// cause. Here glibc happens to keep the library anyway, for its STB_GNU_UNIQUE symbols, which a
// build with another libstdc++ may lack, so the flag itself is checked too.) Loaded again, the
// plugin is the same one, its sidecar client still connected, and takes new comms.
TEST(NcclPluginLoad, UnloadedWithItsThreadsRunningAndLoadedAgain) {
    Pair nodes("tcp");
    ASSERT_TRUE(nodes.ready()) << nodes.logs();
    const pid_t child = forkClient([&] {
        ::setenv("TENSORLANE_NCCL_TRACE", "1", 1);  // starts the watchdog
        ::setenv("TENSORLANE_NCCL_COPY_THREADS", "2", 1);
        for (int round = 0; round < 2; ++round) {
            Plugin p;
            if (!p.open(nodes.a->socket())) {
                return 10 + round;
            }
            char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
            void *listen_comm = nullptr;
            if (p.v8->listen(0, handle, &listen_comm) != ncclSuccess ||
                p.v8->closeListen(listen_comm) != ncclSuccess) {
                return 20 + round;
            }
            if (round == 0 && !markedNoDelete()) {
                return 40;  // glibc may keep it anyway (STB_GNU_UNIQUE symbols); not every build
            }
            if (::dlclose(p.lib) != 0) {
                return 30 + round;
            }
            // Past the watchdog's next wake-up.
            std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        }
        return 0;
    });
    EXPECT_EQ(waitChild(child), 0) << "128 + a signal's number: the child died of that signal";
}

// TENSORLANE_NCCL_TRACE_FILE=PREFIX keeps the trace's lines in memory, each with the wall
// clock's microseconds, and writes them to PREFIX.PID when the process exits (after NCCL
// unloaded the plugin too): nothing goes to NCCL's log meanwhile.
TEST(NcclPluginLoad, ATraceFileGetsEveryStepWithItsTimeAtExit) {
    Pair nodes("tcp");
    ASSERT_TRUE(nodes.ready()) << nodes.logs();
    TempDir dir;
    const std::string prefix = dir.file("trace");
    const pid_t child = ::fork();
    if (child == 0) {
        ::setenv("TENSORLANE_NCCL_TRACE_FILE", prefix.c_str(), 1);
        Plugin p;
        char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
        void *listen_comm = nullptr;
        if (!p.open(nodes.a->socket()) || p.v8->listen(0, handle, &listen_comm) != ncclSuccess ||
            p.v8->closeListen(listen_comm) != ncclSuccess || ::dlclose(p.lib) != 0) {
            ::_exit(10);
        }
        std::exit(Plugin::traceLines() != 0 ? 11 : 0);  // exit(): the trace is written at exit
    }
    ASSERT_EQ(waitChild(child), 0) << "11: a trace line went to NCCL's log";
    std::ifstream in(prefix + "." + std::to_string(child));
    ASSERT_TRUE(in.good()) << "no " << prefix << "." << child;
    std::string line;
    bool closed = false;
    while (std::getline(in, line)) {
        double t = 0;
        char comm = 0;
        unsigned long long id = 0;
        if (std::sscanf(line.c_str(), "%lf close comm %c%llu", &t, &comm, &id) == 3 &&
            comm == 'L') {
            // Within a minute of now: the wall clock's seconds, microseconds after the point.
            const double now =
                std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                    .count();
            EXPECT_LT(std::abs(now - t), 60.0) << line;
            EXPECT_EQ(line.find('.'), line.find(' ') - 7)
                << "not six digits of microseconds: " << line;
            closed = true;
        }
    }
    EXPECT_TRUE(closed) << "no 'close comm L...' line in the trace file";
}

// Host buffers the sidecar can reach (NCCL's cuMem host buffers on a GPU machine; here ranges
// of the plugin's own tl_alloc_host buffers, which tl_register takes the same way) are used in
// place: every size, grouped and out of order arrive whole, nothing is written past a message,
// and with no eager ring the plugin copies no byte (its counts at close).
TEST_P(NcclPlugin, HostBuffersTheSidecarReachesAreUsedInPlace) {
    Pair nodes(GetParam());
    ASSERT_TRUE(nodes.ready()) << nodes.logs();
    const EagerMode modes[] = {{"default", nullptr, nullptr, -1},
                               {"no eager ring", "0", nullptr, 0}};
    for (const EagerMode &mode : modes) {
        SCOPED_TRACE(mode.name);
        Pipe handle;
        int speed = 0;
        std::string pci;
        ASSERT_TRUE(expectedDevice(GetParam(), *nodes.b, &speed, &pci)) << pci;
        const pid_t r = forkClient([&] {
            useEagerMode(mode);
            return receiver(nodes.b->socket(), handle, false, speed, pci, true);
        });
        const pid_t s = forkClient([&] {
            useEagerMode(mode);
            return sender(nodes.a->socket(), handle, false, mode.eager, true);
        });
        EXPECT_EQ(waitChild(s), 0) << nodes.logs();
        EXPECT_EQ(waitChild(r), 0) << nodes.logs();
    }
}

/// Eager sends complete before their receives are posted, at most a ring's worth of them (the
/// next waits until the receiver gives slots back); receives posted later, tag by tag in an
/// order of their own, get every message whole, in each tag's order. The receives of a slot's
/// size send no CTS (their message comes eagerly): a send that finds no free slot asks for its
/// CTS with RTS; a send bigger than a slot goes into its receive's CTS.
TEST_P(NcclPlugin, EagerSendsRunAheadByOneRingAndLandWhenTheirReceivesArePosted) {
    Pair nodes(GetParam());
    ASSERT_TRUE(nodes.ready()) << nodes.logs();
    constexpr int kSlots = 8, kSlotBytes = 4096;
    // Two tags interleaved: message k has tag 1 + k % 2, k * 37 % 4097 bytes (up to one slot;
    // 0-byte ones among them) and its own content; message kSlots+2 is 100 KiB (no slot).
    constexpr int kMessages = 24, kBig = kSlots + 2;
    const auto bytesOf = [](int k) { return k == kBig ? 100 << 10 : k * 37 % (kSlotBytes + 1); };
    Pipe handle, phase;
    const pid_t r = forkClient([&]() -> int {
        ::setenv("TENSORLANE_NCCL_EAGER_SLOTS", std::to_string(kSlots).c_str(), 1);
        ::setenv("TENSORLANE_NCCL_EAGER_BYTES", std::to_string(kSlotBytes).c_str(), 1);
        Plugin p;
        void *rc = listenAndAccept(p, nodes.b->socket(), {&handle});
        if (rc == nullptr) {
            return 2;
        }
        std::vector<unsigned char> buf(kMessages << 17, 0xee);
        void *mh = nullptr;
        if (p.v8->regMr(rc, buf.data(), buf.size(), NCCL_PTR_HOST, &mh) != ncclSuccess) {
            return 3;
        }
        char go = 0;
        if (!phase.get(&go, 1)) {  // the sender has run ahead as far as it can
            return 4;
        }
        // Tag 2's receives first, then tag 1's: each tag's messages in its own order.
        std::vector<unsigned char> expect(128 << 10);
        for (int tag : {2, 1}) {
            for (int k = tag - 1; k < kMessages; k += 2) {
                void *data[1] = {buf.data() + (static_cast<size_t>(k) << 17)};
                int size = k == kBig ? 128 << 10 : kSlotBytes, t = tag;
                void *req = nullptr;
                if (!pollFor([&] { return p.v8->irecv(rc, 1, data, &size, &t, &mh, &req); },
                             &req)) {
                    return 10;
                }
                int got = -1;
                if (waitDone(p.v8, req, &got) != ncclSuccess || got != bytesOf(k)) {
                    std::fprintf(stderr, "message %d: %d bytes, want %d\n", k, got, bytesOf(k));
                    return 11;
                }
                fillRandom(expect.data(), static_cast<size_t>(got), 7000 + k);
                const auto *at = static_cast<unsigned char *>(data[0]);
                if (std::memcmp(at, expect.data(), static_cast<size_t>(got)) != 0 ||
                    at[got] != 0xee) {
                    std::fprintf(stderr, "message %d differs (or wrote past its end)\n", k);
                    return 12;
                }
            }
        }
        return p.v8->closeRecv(rc) == ncclSuccess ? 0 : 13;
    });
    const pid_t s = forkClient([&]() -> int {
        Plugin p;
        void *sc = connectWith(p, nodes.a->socket(), handle);
        if (sc == nullptr) {
            return 2;
        }
        std::vector<unsigned char> src(kMessages << 17);
        void *mh = nullptr;
        if (p.v8->regMr(sc, src.data(), src.size(), NCCL_PTR_HOST, &mh) != ncclSuccess) {
            return 3;
        }
        const auto isend = [&](int k, void **req) {
            unsigned char *at = src.data() + (static_cast<size_t>(k) << 17);
            fillRandom(at, static_cast<size_t>(bytesOf(k)), 7000 + k);
            return p.v8->isend(sc, at, bytesOf(k), 1 + k % 2, mh, req);
        };
        // The ring's worth goes at once and ends, with no receive posted.
        std::vector<void *> reqs(kMessages, nullptr);
        for (int k = 0; k < kSlots; ++k) {
            if (!pollFor([&] { return isend(k, &reqs[k]); }, &reqs[k], std::chrono::seconds(5)) ||
                waitDone(p.v8, reqs[k], nullptr, std::chrono::seconds(5)) != ncclSuccess) {
                std::fprintf(stderr, "eager send %d did not go before its receive\n", k);
                return 10;
            }
        }
        // The next one has no slot: it waits (for its CTS or a credit).
        const auto until = Clock::now() + std::chrono::milliseconds(300);
        while (Clock::now() < until) {
            if (isend(kSlots, &reqs[kSlots]) != ncclSuccess) {
                return 11;
            }
            if (reqs[kSlots] != nullptr) {
                std::fprintf(stderr, "send %d went with the ring full\n", kSlots);
                return 12;
            }
        }
        char go = 1;
        if (!phase.put(&go, 1)) {
            return 13;
        }
        // As NCCL's proxy does: each tag's sends in order, the tags independently (a send
        // that waits holds up only its own tag).
        int next[2] = {kSlots, kSlots + 1};
        const auto end = Clock::now() + std::chrono::seconds(20);
        while ((next[0] < kMessages || next[1] < kMessages) && Clock::now() < end) {
            for (int &k : next) {
                if (k < kMessages) {
                    if (isend(k, &reqs[k]) != ncclSuccess) {
                        return 14;
                    }
                    if (reqs[k] != nullptr) {
                        k += 2;
                    }
                }
            }
        }
        if (next[0] < kMessages || next[1] < kMessages) {
            std::fprintf(stderr, "sends %d and %d never went\n", next[0], next[1]);
            return 17;
        }
        for (int k = kSlots; k < kMessages; ++k) {
            if (waitDone(p.v8, reqs[k], nullptr) != ncclSuccess) {
                return 15;
            }
        }
        if (p.v8->closeSend(sc) != ncclSuccess) {
            return 16;
        }
        // The first ring went eagerly; the sends that found it full asked with RTS (message 1's
        // slot is held until tag 1's receives are posted, after tag 2's); the big one went
        // into its CTS.
        unsigned long long eager = 0, direct = 0, rts = 0, waited = 0;
        double copied = 0;
        if (!Plugin::sendCounts(&eager, &direct, &rts, &waited, &copied) || eager < kSlots ||
            rts < 1 || direct < 1 || eager + direct != kMessages || waited < 1 || copied <= 0) {
            std::fprintf(stderr, "sends: %llu eager, %llu into a CTS, %llu RTS, %llu waited\n",
                         eager, direct, rts, waited);
            return 18;
        }
        return 0;
    });
    EXPECT_EQ(waitChild(s), 0) << nodes.logs();
    EXPECT_EQ(waitChild(r), 0) << nodes.logs();
}

/// A receive of a slot's size is held quietly for an eager send; a send too big for it (and for
/// a slot) must not wait forever for a CTS that would never come: it asks with RTS, learns the
/// receive's size and fails as truncated.
TEST_P(NcclPlugin, ASendBiggerThanAQuietReceiveFailsInsteadOfWaiting) {
    Pair nodes(GetParam());
    ASSERT_TRUE(nodes.ready()) << nodes.logs();
    Pipe handle, done;
    const pid_t r = forkClient([&]() -> int {
        Plugin p;
        void *rc = listenAndAccept(p, nodes.b->socket(), {&handle});
        if (rc == nullptr) {
            return 2;
        }
        std::vector<unsigned char> buf(1 << 20);
        void *mh = nullptr, *req = nullptr;
        void *data[1] = {buf.data()};
        int size = 4096, tag = 3;
        if (p.v8->regMr(rc, buf.data(), buf.size(), NCCL_PTR_HOST, &mh) != ncclSuccess ||
            !pollFor([&] { return p.v8->irecv(rc, 1, data, &size, &tag, &mh, &req); }, &req)) {
            return 3;
        }
        // As NCCL's proxy does, test the receive until the sender is through (the test is
        // what takes the sender's RTS in).
        for (;;) {
            pollfd pf{done.fd[0], POLLIN, 0};
            if (::poll(&pf, 1, 0) == 1) {
                return 0;
            }
            int finished = 0;
            if (p.v8->test(req, &finished, nullptr) == ncclSuccess && finished != 0) {
                return 4;  // a receive nothing was sent into ended well
            }
        }
    });
    const pid_t s = forkClient([&]() -> int {
        Plugin p;
        void *sc = connectWith(p, nodes.a->socket(), handle);
        if (sc == nullptr) {
            return 2;
        }
        std::vector<unsigned char> src(1 << 20, 1);
        void *mh = nullptr;
        if (p.v8->regMr(sc, src.data(), src.size(), NCCL_PTR_HOST, &mh) != ncclSuccess) {
            return 3;
        }
        const auto end = Clock::now() + std::chrono::seconds(10);
        while (Clock::now() < end) {
            void *req = nullptr;
            if (p.v8->isend(sc, src.data(), 100 << 10, 3, mh, &req) != ncclSuccess) {
                return 0;  // refused: truncated
            }
            if (req != nullptr) {
                return 5;  // sent into a receive too small for it
            }
        }
        return 6;  // a hang
    });
    EXPECT_EQ(waitChild(s), 0) << nodes.logs();
    char one = 1;
    EXPECT_TRUE(done.put(&one, 1));
    EXPECT_EQ(waitChild(r), 0) << nodes.logs();
}

/// Plugin payloads written into a receive comm's eager ring by someone who is not its sender
/// (a client of the sender's node that knows the ring's name from the handle): a forged EAGER
/// from another process, payloads too short for their kind, unknown kinds, a CTS and an RTS to
/// the wrong kind of comm, bare bytes with a data immediate. None of it fails the comm or lands
/// anywhere; the real sender's eager and CTS messages that follow arrive whole.
TEST_P(NcclPlugin, ForeignPayloadsInTheEagerRingAreIgnored) {
    Pair nodes(GetParam());
    ASSERT_TRUE(nodes.ready()) << nodes.logs();
    Pipe handle, handle2, forged, forged2, sent;
    constexpr int kCount = 6;
    const auto bytesOf = [](int k) { return k == 3 ? 300 << 10 : 1000 * k + 1; };
    const pid_t r = forkClient([&]() -> int {
        Plugin p;
        void *rc = listenAndAccept(p, nodes.b->socket(), {&handle, &handle2});
        if (rc == nullptr) {
            return 2;
        }
        std::vector<unsigned char> buf(kCount << 19, 0xee);
        void *mh = nullptr;
        if (p.v8->regMr(rc, buf.data(), buf.size(), NCCL_PTR_HOST, &mh) != ncclSuccess) {
            return 3;
        }
        char go = 0;
        if (!forged.get(&go, 1) || !sent.get(&go, 1)) {
            return 4;
        }
        std::vector<unsigned char> expect(512 << 10);
        for (int k = 0; k < kCount; ++k) {
            void *data[1] = {buf.data() + (static_cast<size_t>(k) << 19)};
            int size = k == 3 ? 512 << 10 : 64 << 10, tag = 5;
            void *req = nullptr;
            if (!pollFor([&] { return p.v8->irecv(rc, 1, data, &size, &tag, &mh, &req); }, &req)) {
                return 10;  // (the comm failed)
            }
            int got = -1;
            if (waitDone(p.v8, req, &got) != ncclSuccess || got != bytesOf(k)) {
                return 11;
            }
            fillRandom(expect.data(), static_cast<size_t>(got), 300 + k);
            const auto *at = static_cast<unsigned char *>(data[0]);
            if (std::memcmp(at, expect.data(), static_cast<size_t>(got)) != 0 || at[got] != 0xee) {
                return 12;
            }
        }
        // Nothing landed outside the messages.
        for (int k = 0; k < kCount; ++k) {
            const size_t from = (static_cast<size_t>(k) << 19) + static_cast<size_t>(bytesOf(k));
            for (size_t i = from; i < (static_cast<size_t>(k) + 1) << 19; ++i) {
                if (buf[i] != 0xee) {
                    return 13;
                }
            }
        }
        return p.v8->closeRecv(rc) == ncclSuccess ? 0 : 14;
    });
    // The forger: a plain client of node-a writing into the receiver's ring (comm 2: the
    // listener is 1) under the name the handle's nonce gives.
    const pid_t f = forkClient([&]() -> int {
        char h[NCCL_NET_HANDLE_MAXSIZE];
        if (!handle2.get(h, sizeof(h))) {
            return 2;
        }
        uint64_t nonce = 0;
        std::memcpy(&nonce, h + 8, sizeof(nonce));
        char name[64];
        std::snprintf(name, sizeof(name), "ncl.%016llx.E2", static_cast<unsigned long long>(nonce));
        tl_client *c = nullptr;
        tl_remote ring = 0;
        void *p = nullptr;
        tl_region src = 0;
        if (tl_connect(nodes.a->socket().c_str(), &c) != TL_OK ||
            tl_alloc_host(c, 1 << 16, &p, &src) != TL_OK) {
            return 3;
        }
        const auto end = Clock::now() + std::chrono::seconds(10);
        while (tl_lookup(c, "node-b", name, &ring, nullptr) != TL_OK) {
            if (Clock::now() > end) {
                return 4;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        // The plugin's header: magic "TLNC", kind, count, to (comm 2), from, nonce; then a body.
        const auto payload = [&](uint8_t kind, uint8_t count, uint64_t from, uint64_t from_nonce,
                                 size_t body_bytes, const void *body) {
            std::vector<unsigned char> out(32 + body_bytes, 0);
            const uint32_t magic = 0x434e4c54u;
            const uint64_t to = 2;
            std::memcpy(out.data(), &magic, 4);
            out[4] = kind;
            out[5] = count;
            std::memcpy(out.data() + 8, &to, 8);
            std::memcpy(out.data() + 16, &from, 8);
            std::memcpy(out.data() + 24, &from_nonce, 8);
            if (body_bytes != 0) {
                std::memcpy(out.data() + 32, body, body_bytes);
            }
            return out;
        };
        const auto post = [&](const std::vector<unsigned char> &pl, uint64_t bytes, uint32_t imm) {
            tl_send_opts o{};
            o.imm = imm;
            o.payload = pl.empty() ? nullptr : pl.data();
            o.payload_bytes = static_cast<uint32_t>(pl.size());
            tl_ticket t = 0;
            return tl_write_msg(c, src, 0, ring, 0, bytes, &o, &t) == TL_OK &&
                   tl_wait(c, t, 5000) == TL_OK;
        };
        std::memset(p, 0x77, 1 << 16);
        struct {
            uint32_t slot;
            int32_t tag;
            uint32_t seq;
            uint32_t reserved;
            uint64_t size;
        } eager{0, 5, 0, 0, 4096};
        const uint32_t rts[2] = {5, 0};
        const unsigned char junk[40] = {1, 2, 3};
        const bool ok =
            // an EAGER for tag 5 seq 0 from another process (its nonce is not the sender's)
            post(payload(5, 1, 1, 0x1234, sizeof(eager), &eager), 4096, 0) &&
            // the same with no bytes written, and one too short for its body
            post(payload(5, 1, 1, 0x1234, sizeof(eager), &eager), 0, 0) &&
            post(payload(5, 1, 1, 0x1234, 4, &eager), 0, 0) &&
            // kinds a receive comm does not take, one it does not know, and a CTS/RTS/credit
            post(payload(2, 6, 1, 0x1234, sizeof(junk), junk), 0, 0) &&
            post(payload(6, 0, 1, 0x1234, sizeof(junk), junk), 0, 0) &&
            post(payload(7, 1, 1, 0x1234, sizeof(rts), rts), 0, 0) &&
            post(payload(99, 1, 1, 0x1234, sizeof(junk), junk), 0, 0) &&
            // shorter than a header, and bare bytes with a data write's immediate
            post(std::vector<unsigned char>(7, 0x54), 0, 0) &&
            post({}, 4096, 0x80000000u | 1u << 8);
        char one = 1;
        return ok && forged.put(&one, 1) && forged2.put(&one, 1) ? 0 : 5;
    });
    const pid_t s = forkClient([&]() -> int {
        Plugin p;
        void *sc = connectWith(p, nodes.a->socket(), handle);
        if (sc == nullptr) {
            return 2;
        }
        std::vector<unsigned char> src(kCount << 19);
        void *mh = nullptr;
        if (p.v8->regMr(sc, src.data(), src.size(), NCCL_PTR_HOST, &mh) != ncclSuccess) {
            return 3;
        }
        std::vector<void *> reqs(kCount, nullptr);
        char one = 1;
        if (!forged2.get(&one, 1)) {  // (connected: the ring exists; the forger is through)
            return 8;
        }
        for (int k = 0; k < kCount; ++k) {
            unsigned char *at = src.data() + (static_cast<size_t>(k) << 19);
            fillRandom(at, static_cast<size_t>(bytesOf(k)), 300 + k);
            if (k == 3 && !sent.put(&one, 1)) {  // the eager ones went; now the receives
                return 4;
            }
            if (!pollFor([&] { return p.v8->isend(sc, at, bytesOf(k), 5, mh, &reqs[k]); },
                         &reqs[k])) {
                return 5;
            }
        }
        for (void *req : reqs) {
            if (waitDone(p.v8, req, nullptr) != ncclSuccess) {
                return 6;
            }
        }
        return p.v8->closeSend(sc) == ncclSuccess ? 0 : 7;
    });
    EXPECT_EQ(waitChild(f), 0) << nodes.logs();
    EXPECT_EQ(waitChild(s), 0) << nodes.logs();
    EXPECT_EQ(waitChild(r), 0) << nodes.logs();
}

/// A peer killed with requests in flight: the survivor's requests end with an error within
/// seconds (no hang), whichever end died.
TEST_P(NcclPlugin, APeerKilledMidTransferFailsTheSurvivorsRequests) {
    Pair nodes(GetParam());
    ASSERT_TRUE(nodes.ready()) << nodes.logs();
    for (const bool kill_sender : {true, false}) {
        SCOPED_TRACE(kill_sender ? "sender killed" : "receiver killed");
        Pipe handle, ready;
        // The receiver posts four receives (one, with the sender killed), the sender fills the
        // first; then one end is killed and the other must see its requests fail.
        const pid_t r = forkClient([&]() -> int {
            Plugin p;
            void *rc = listenAndAccept(p, nodes.b->socket(), {&handle});
            if (rc == nullptr) {
                return 2;
            }
            std::vector<unsigned char> buf(4 << 20);
            void *mh = nullptr;
            if (p.v8->regMr(rc, buf.data(), buf.size(), NCCL_PTR_HOST, &mh) != ncclSuccess) {
                return 3;
            }
            void *reqs[4] = {};
            const int posted = kill_sender ? 4 : 1;
            for (int k = 0; k < posted; ++k) {
                void *data[1] = {buf.data() + k * (1 << 20)};
                int size = 1 << 20, tag = 1;
                if (!pollFor([&] { return p.v8->irecv(rc, 1, data, &size, &tag, &mh, &reqs[k]); },
                             &reqs[k])) {
                    return 4;
                }
            }
            if (waitDone(p.v8, reqs[0], nullptr) != ncclSuccess) {
                return 5;
            }
            char one = 1;
            if (!ready.put(&one, 1)) {
                return 6;
            }
            if (!kill_sender) {
                ::pause();  // killed here
            }
            for (int k = 1; k < 4; ++k) {
                const ncclResult_t res = waitDone(p.v8, reqs[k], nullptr, std::chrono::seconds(20));
                if (res == ncclSuccess) {
                    return 7;  // a receive nobody sent ended well
                }
                if (res == ncclInProgress) {
                    return 8;  // a hang
                }
            }
            return 0;
        });
        const pid_t s = forkClient([&]() -> int {
            Plugin p;
            void *sc = connectWith(p, nodes.a->socket(), handle);
            if (sc == nullptr) {
                return 2;
            }
            std::vector<unsigned char> src(1 << 20, 5);
            void *mh = nullptr, *req = nullptr;
            if (p.v8->regMr(sc, src.data(), src.size(), NCCL_PTR_HOST, &mh) != ncclSuccess ||
                !pollFor([&] { return p.v8->isend(sc, src.data(), 1 << 20, 1, mh, &req); }, &req) ||
                waitDone(p.v8, req, nullptr) != ncclSuccess) {
                return 3;
            }
            if (kill_sender) {
                ::pause();  // killed here
            }
            // The receiver posts nothing more and dies: the next sends must fail, not wait.
            // A 4 KiB send fits the receiver's eager ring, so it may be taken (a request) before
            // the sender knows: then that request must end with an error. The 1 MiB one waits
            // for a CTS that never comes, and must fail too.
            for (const int bytes : {4096, 1 << 20}) {
                const auto end = Clock::now() + std::chrono::seconds(20);
                bool failed = false;
                while (!failed && Clock::now() < end) {
                    void *next = nullptr;
                    const ncclResult_t res = p.v8->isend(sc, src.data(), bytes, 1, mh, &next);
                    if (res != ncclSuccess) {
                        failed = true;
                    } else if (next != nullptr) {
                        const ncclResult_t end_res =
                            waitDone(p.v8, next, nullptr, std::chrono::seconds(20));
                        if (end_res == ncclSuccess && bytes > (64 << 10)) {
                            return 4;  // a send too big for a slot, into a receive nobody posted
                        }
                        if (end_res == ncclInProgress) {
                            return 5;  // a hang
                        }
                        failed = end_res != ncclSuccess;
                    } else {
                        std::this_thread::sleep_for(std::chrono::milliseconds(1));
                    }
                }
                if (!failed) {
                    return 6;  // a hang
                }
            }
            return 0;
        });
        char one = 0;
        ASSERT_TRUE(ready.get(&one, 1)) << nodes.logs();
        const auto killed_at = Clock::now();
        ::kill(kill_sender ? s : r, SIGKILL);
        EXPECT_EQ(waitChild(kill_sender ? r : s), 0) << nodes.logs();
        EXPECT_EQ(waitChild(kill_sender ? s : r), 128 + SIGKILL);
        EXPECT_LT(Clock::now() - killed_at, std::chrono::seconds(15));
    }
}

}  // namespace
