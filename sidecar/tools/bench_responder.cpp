#include "bench_responder.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <iostream>
#include <thread>

#include "bench_env.hpp"

namespace tensorlane::tools::bench {
namespace {

using Clock = std::chrono::steady_clock;

void sendReply(int fd, int32_t status, const std::string &error) {
    ReplyMsg r{};
    r.status = status;
    copyName(r.error, sizeof(r.error), error);
    (void)::send(fd, &r, sizeof(r), MSG_NOSIGNAL);
}

/// Where the responder reports: the bench over `ctl` (a forked responder), or stderr (one
/// started on its own with --respond, on another host).
struct ReplyTo {
    int ctl = -1;
    void fail(const std::string &error) const {
        if (ctl >= 0) {
            sendReply(ctl, 1, error);
        } else {
            std::cerr << "tensorlane bench --respond: " << error << "\n";
        }
    }
    void ready() const {
        if (ctl >= 0) {
            sendReply(ctl, 0, "");
        } else {
            std::cerr << "tensorlane bench --respond: ready\n";
        }
    }
};

}  // namespace

int64_t nowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
        .count();
}

void copyName(char *dst, size_t cap, const std::string &src) {
    std::memset(dst, 0, cap);
    std::memcpy(dst, src.data(), std::min(src.size(), cap - 1));
}

std::string callError(const std::string &what) {
    return what + ": " + tl_last_error();
}

tl_status lookupRetry(tl_client *c, const std::string &peer, const std::string &name,
                      tl_remote *out, std::chrono::seconds timeout) {
    auto end = Clock::now() + timeout;
    for (;;) {
        tl_status s = tl_lookup(c, peer.c_str(), name.c_str(), out, nullptr);
        if ((s != TL_ENOENT && s != TL_EPEER) || Clock::now() > end || interrupted()) {
            return s;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

int responderMain(int ctl, const std::string &socket, EchoStamp *stamps, const SetupMsg *given) {
    const ReplyTo reply{ctl};
    SetupMsg setup{};
    if (given != nullptr) {
        setup = *given;
    } else {
        for (;;) {
            pollfd p{ctl, POLLIN, 0};
            int n = ::poll(&p, 1, 200);
            if (interrupted()) {
                return 0;
            }
            if (n > 0) {
                break;
            }
        }
        if (::recv(ctl, &setup, sizeof(setup), 0) != static_cast<ssize_t>(sizeof(setup))) {
            return 0;  // the bench gave up before it began
        }
    }
    setup.a_node[63] = setup.a_region[63] = setup.b_region[63] = '\0';
    tl_client *raw = nullptr;
    if (tl_connect(socket.c_str(), &raw) != TL_OK) {
        reply.fail("responder: " + callError("tl_connect " + socket));
        return 1;
    }
    ClientPtr c(raw);
    void *buf = nullptr;
    tl_region region = 0;
    tl_remote back = 0;
    if (tl_alloc_host(c.get(), setup.max_bytes, &buf, &region) != TL_OK) {
        reply.fail("responder: " + callError("tl_alloc_host"));
        return 1;
    }
    std::memset(buf, 0, setup.max_bytes);
    if (tl_expose(c.get(), region, setup.b_region) != TL_OK) {
        reply.fail("responder: " + callError("tl_expose"));
        return 1;
    }
    // On its own the responder is started first, and waits for the bench on the other host.
    const auto wait_peer = given != nullptr ? std::chrono::seconds(600) : std::chrono::seconds(30);
    if (tl_status s = lookupRetry(c.get(), setup.a_node, setup.a_region, &back, wait_peer);
        s != TL_OK) {
        reply.fail(std::string("responder: tl_lookup of ") + setup.a_region + " on " +
                   setup.a_node + ": " + tl_status_str(s) + ": " + tl_last_error());
        return 1;
    }
    reply.ready();

    std::deque<tl_ticket> pending;
    auto reap = [&](bool all) -> bool {
        while (!pending.empty()) {
            int done = 0;
            tl_status s = all ? tl_wait(c.get(), pending.front(), 10000)
                              : tl_test(c.get(), pending.front(), &done);
            if (!all && s == TL_OK && !done) {
                return true;
            }
            if (s != TL_OK) {
                reply.fail(std::string("responder: echo write failed: ") + tl_status_str(s) + ": " +
                           tl_last_error());
                return false;
            }
            pending.pop_front();
        }
        return true;
    };
    while (!interrupted()) {
        tl_notification n{};
        tl_status s = tl_wait_notification(c.get(), &n, 100);
        if (s == TL_ETIMEDOUT) {
            pollfd p{ctl, POLLIN | POLLRDHUP, 0};
            if (ctl >= 0 && ::poll(&p, 1, 0) > 0) {
                break;  // the bench is done (closed its end) or asks us to stop
            }
            if (!reap(false)) {
                return 1;
            }
            continue;
        }
        if (s != TL_OK) {
            reply.fail(std::string("responder: tl_wait_notification: ") + tl_status_str(s) + ": " +
                       tl_last_error());
            return 1;
        }
        if (n.imm == kByeImm) {
            break;  // the bench on the other host is done
        }
        if (n.imm & kEchoBit) {
            const int64_t noted = nowNs();
            tl_ticket t = 0;
            s = tl_write(c.get(), region, 0, back, 0, n.bytes, n.imm, &t);
            while (s == TL_EAGAIN && !pending.empty()) {
                if (!reap(false)) {
                    return 1;
                }
                s = tl_write(c.get(), region, 0, back, 0, n.bytes, n.imm, &t);
            }
            if (s != TL_OK) {
                reply.fail(std::string("responder: echo tl_write: ") + tl_status_str(s) + ": " +
                           tl_last_error());
                return 1;
            }
            pending.push_back(t);
            if (stamps != nullptr) {
                EchoStamp &slot = stamps[n.imm & (kStampSlots - 1)];
                slot.noted_ns = noted;
                slot.posted_ns = nowNs();
                // SYNC POINT: release; the bench acquires imm and then reads the times.
                slot.imm.store(n.imm, std::memory_order_release);
            }
        }
        if (!reap(false)) {
            return 1;
        }
    }
    return reap(true) ? 0 : 1;
}

}  // namespace tensorlane::tools::bench
