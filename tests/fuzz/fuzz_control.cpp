// libFuzzer target for what a client sends the sidecar: control messages on its socket (the
// decoding of ipc/control.hpp's messages in control_server.cpp) and entries in its request ring
// (the validation in request_pipeline.cpp). A real engine runs in this process, on its own thread,
// as the daemon runs it; each input is one client that connects, sends what the input says, and
// goes.
//
// The input is a list of records, each [tag][length: 2 bytes, big-endian][payload]:
//   tag % 4 == 0: the payload is one control datagram, as it is;
//   tag % 4 == 1: a datagram with a valid header (type = payload[0] % 20, a fresh seq) and the
//                 rest of the payload after it (padded or cut to the type's size when
//                 payload[1] is odd), so the handlers behind the header are reached;
//   tag % 4 == 2: a request ring entry (64 bytes, zero-padded), published, doorbell rung;
//   tag % 4 == 3: like 1, with a file descriptor attached (a memfd).
// Checks: every datagram gets exactly one well-formed reply (or the session is closed), a
// reply names the seq it answers, and after the input the engine still serves a new client.
// A crash, an abort or a hang (-timeout) of the engine is a finding.
// spdlog first, under the pragmas sidecar/src/spdlog_headers.hpp explains (GCC 13 and fmt 9).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#endif
#include <spdlog/spdlog.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "tensorlane/config/config.hpp"
#include "tensorlane/ipc/control.hpp"
#include "tensorlane/ipc/layout.hpp"
#include "tensorlane/ipc/shm.hpp"
#include "tensorlane/ipc/socket.hpp"
#include "tensorlane/sidecar/engine.hpp"

namespace ipc = tensorlane::ipc;

namespace {

/// Stops the run with a crash libFuzzer reports (and saves the input for), saying which check.
void check(bool condition, int line = __builtin_LINE()) {
    if (!condition) {
        std::fprintf(stderr, "fuzz_control.cpp:%d: check failed\n", line);
        std::abort();
    }
}

/// Longest a reply may take: none of these calls waits on anything but the engine.
constexpr int kReplyTimeoutMs = 5000;

/// Waits up to kReplyTimeoutMs for `fd` to be readable; true if it is. A signal does not end
/// the wait: libFuzzer's -timeout watchdog is a SIGALRM every few seconds, and poll() is never
/// restarted after a handler (signal(7)), so an EINTR is no hang.
bool waitReadable(int fd) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(kReplyTimeoutMs);
    for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        pollfd p{fd, POLLIN, 0};
        const int n = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
        if (n >= 0 || errno != EINTR) {
            return n == 1;
        }
    }
}

/// One engine for the whole run: started on first use, on a socket of its own.
class EngineUnderTest {
public:
    static EngineUnderTest &get() {
        // Never destroyed: the engine thread runs until the process exits.
        static EngineUnderTest *e = new EngineUnderTest;
        return *e;
    }
    const std::string &socket() const { return socket_; }

private:
    EngineUnderTest() {
        spdlog::set_level(spdlog::level::off);  // hostile input makes it warn a lot
        char tmpl[] = "/tmp/tl-fuzz-control-XXXXXX";
        const char *dir = ::mkdtemp(tmpl);
        check(dir != nullptr);
        socket_ = std::string(dir) + "/sidecar.sock";
        // Small quotas keep allocations cheap; no per-pid cap (every input is a new session
        // of this one process, and the old one may not be reaped yet).
        const std::string toml = "[node]\nname = \"fuzz\"\nlisten = \"127.0.0.1:1\"\nsocket = \"" +
                                 socket_ +
                                 "\"\n[ipc]\nring_depth = 16\npoll_mode = \"event\"\n"
                                 "[limits]\nregions = 64\nregistered_bytes = \"16MiB\"\n"
                                 "node_registered_bytes = \"64MiB\"\nin_flight = 64\n"
                                 "sessions_per_pid = 1048576\nsessions_per_uid = 1048576\n";
        auto parsed = tensorlane::config::parseString(
            toml, "fuzz.toml", tensorlane::config::ParseOptions{.check_key_file = false});
        check(parsed.ok());
        tensorlane::sidecar::Status st;
        engine_ = tensorlane::sidecar::Engine::create(*parsed.config, &st);
        check(engine_ != nullptr);
        check(engine_->start().isOk());
        spdlog::set_level(spdlog::level::off);
        thread_ = std::thread([this] { engine_->run(); });
        thread_.detach();  // runs until the process exits
    }
    std::string socket_;
    std::unique_ptr<tensorlane::sidecar::Engine> engine_;
    std::thread thread_;
};

/// A client that speaks the protocol by hand.
struct RawClient {
    ipc::UniqueFd sock, to_sidecar;
    ipc::Mapping seg;
    ipc::SegmentView view;
    ipc::SegmentGeometry geometry;
    uint64_t published = 0;
    uint64_t seq = 1;
    bool closed = false;

    bool connect(const std::string &path) {
        if (ipc::connectSeqpacket(path, &sock) != 0) {
            return false;
        }
        ipc::HelloMsg hello{};
        ipc::UniqueFd fds[ipc::kMaxFdsPerMessage];
        size_t bytes = 0, nfds = 0;
        if (!waitReadable(sock.get()) ||
            ipc::receiveMessage(sock.get(), &hello, sizeof(hello), &bytes, fds, &nfds) != 0) {
            std::fprintf(stderr, "fuzz_control: no greeting\n");
            return false;
        }
        if (bytes != sizeof(hello) || hello.status != 0 || nfds != 3) {
            hello.error[sizeof(hello.error) - 1] = '\0';
            std::fprintf(stderr, "fuzz_control: greeting of %zu bytes, status %d, %zu fds: %s\n",
                         bytes, hello.status, nfds, hello.error);
            return false;
        }
        if (ipc::mapSegment(fds[0].get(), hello.segment_bytes, &seg) != 0 ||
            !ipc::validateSegment(seg.data(), seg.size(), &geometry)) {
            return false;
        }
        view = ipc::SegmentView::at(seg.data(), geometry);
        to_sidecar = std::move(fds[1]);
        return true;
    }

    /// Sends one datagram and takes its one reply; sets `closed` once the session is.
    void send(const void *msg, size_t bytes, int fd, bool framed, uint64_t want_seq) {
        int fds[1] = {fd};
        const int rc =
            ipc::sendMessage(sock.get(), msg, bytes,
                             fd >= 0 ? std::span<const int>(fds, 1) : std::span<const int>());
        if (rc != 0) {
            closed = true;  // EPIPE/ECONNRESET: the sidecar closed us; EMSGSIZE: never sent
            check(rc == EPIPE || rc == ECONNRESET || rc == EMSGSIZE);
            return;
        }
        // A datagram left unanswered, and the session still open: a hang.
        check(waitReadable(sock.get()));
        alignas(8) static unsigned char buf[ipc::kMaxControlMessage];
        ipc::UniqueFd got_fds[ipc::kMaxFdsPerMessage];
        size_t got = 0, nfds = 0;
        const int r =
            ipc::receiveMessage(sock.get(), buf, sizeof(buf), &got, got_fds, &nfds, MSG_DONTWAIT);
        if (r != 0 || got == 0) {
            closed = true;  // hung up on us: allowed (e.g. a corrupt ring), never a crash
            return;
        }
        check(got >= sizeof(ipc::ReplyMsg));
        ipc::ReplyMsg reply;
        std::memcpy(&reply, buf, sizeof(reply));
        check(reply.h.magic == ipc::kControlMagic && reply.h.version == ipc::kControlVersion);
        check(reply.h.type == static_cast<uint16_t>(ipc::MsgType::kReply));
        check(std::memchr(reply.error, '\0', sizeof(reply.error)) != nullptr);
        check(nfds <= 1);
        if (framed) {
            check(reply.h.seq == want_seq);
        }
        if (reply.status != 0) {
            check(reply.error[0] != '\0');  // every refusal says why
            check(nfds == 0);
        }
    }

    /// Writes `r` into the next request slot the way the ring does, then rings.
    void publish(const ipc::Request &r) {
        const uint32_t depth = geometry.request_depth;
        ipc::Request &slot = view.requests[published & (depth - 1)];
        std::memcpy(&slot, &r, offsetof(ipc::Request, ring_seq));
        // SYNC POINT: release publishes the payload with the slot's sequence word.
        std::atomic_ref<uint64_t>(slot.ring_seq).store(published + 1, std::memory_order_release);
        ++published;
        uint64_t one = 1;
        [[maybe_unused]] ssize_t n = ::write(to_sidecar.get(), &one, sizeof(one));
    }
};

/// The fixed size of a message type (0 for an unknown one).
size_t sizeOf(uint16_t type) {
    switch (static_cast<ipc::MsgType>(type)) {
        case ipc::MsgType::kAllocHost:
            return sizeof(ipc::AllocHostMsg);
        case ipc::MsgType::kRegister:
            return sizeof(ipc::RegisterMsg);
        case ipc::MsgType::kDeregister:
            return sizeof(ipc::DeregisterMsg);
        case ipc::MsgType::kExpose:
            return sizeof(ipc::ExposeMsg);
        case ipc::MsgType::kLookup:
            return sizeof(ipc::LookupMsg);
        case ipc::MsgType::kStatus:
            return sizeof(ipc::StatusMsg);
        case ipc::MsgType::kStreamSetup:
            return sizeof(ipc::MsgHeader);
        case ipc::MsgType::kStreamSubscribe:
            return sizeof(ipc::StreamSubscribeMsg);
        case ipc::MsgType::kStreamCredit:
            return sizeof(ipc::StreamCreditMsg);
        case ipc::MsgType::kExposeAccess:
            return sizeof(ipc::ExposeAccessMsg);
        case ipc::MsgType::kVmmPieces:
            return sizeof(ipc::VmmPiecesMsg);
        default:
            return 0;
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const EngineUnderTest &engine = EngineUnderTest::get();
    RawClient c;
    check(c.connect(engine.socket()));
    size_t pos = 0;
    int records = 0;
    while (pos + 3 <= size && !c.closed && records++ < 64) {
        const uint8_t tag = data[pos];
        const size_t len =
            std::min<size_t>((size_t{data[pos + 1]} << 8) | data[pos + 2], size - pos - 3);
        const uint8_t *payload = data + pos + 3;
        pos += 3 + len;
        switch (tag % 4) {
            case 0:
                if (len != 0) {
                    c.send(payload, len, -1, false, 0);
                }
                break;
            case 1:
            case 3: {
                const uint16_t type = len > 0 ? payload[0] % 21 : 0;
                const size_t body = len > 2 ? len - 2 : 0;
                size_t total = sizeof(ipc::MsgHeader) + body;
                if (len > 1 && (payload[1] & 1) != 0 && sizeOf(type) != 0) {
                    total = sizeOf(type);  // the type's exact size: its handler runs
                }
                std::string msg(total, '\0');
                const ipc::MsgHeader h{ipc::kControlMagic, ipc::kControlVersion, type, c.seq++};
                std::memcpy(msg.data(), &h, sizeof(h));
                std::memcpy(msg.data() + sizeof(h), payload + std::min<size_t>(len, 2),
                            std::min(body, total - sizeof(h)));
                ipc::UniqueFd memfd;
                if (tag % 4 == 3) {
                    memfd.reset(::memfd_create("fuzz", MFD_CLOEXEC));
                    if (memfd) {
                        [[maybe_unused]] int rc = ::ftruncate(memfd.get(), 4096);
                    }
                }
                c.send(msg.data(), msg.size(), memfd ? memfd.get() : -1, true, h.seq);
                break;
            }
            case 2: {
                ipc::Request r{};
                std::memcpy(&r, payload, std::min(len, sizeof(r)));
                c.publish(r);
                break;
            }
        }
    }
    c = RawClient();  // hangs up
    // The engine still serves: a new client is greeted and answered.
    RawClient probe;
    check(probe.connect(engine.socket()));
    ipc::StatusMsg st{};
    st.h = ipc::MsgHeader{ipc::kControlMagic, ipc::kControlVersion,
                          static_cast<uint16_t>(ipc::MsgType::kStatus), 1};
    probe.send(&st, sizeof(st), -1, true, 1);
    check(!probe.closed);
    return 0;
}
