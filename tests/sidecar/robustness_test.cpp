// A sidecar facing dead, refused and hostile clients, and clients facing a dead sidecar.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <grp.h>
#include <sys/stat.h>

#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

#include "../metrics/http_client.hpp"
#include "harness.hpp"
#include "raw_client.hpp"
#include "round_trip.hpp"
#include "tensorlane/ipc/control.hpp"
#include "tensorlane/ipc/layout.hpp"
#include "tensorlane/ipc/shm.hpp"
#include "tensorlane/ipc/socket.hpp"
#include "tensorlane/ipc/status.hpp"
#include "tensorlane/tensorlane.hpp"

using namespace tltest;
namespace ipc = tensorlane::ipc;

namespace {

/// A client doing a verified local round trip; true on success.
bool healthyRoundTrip(const std::string &sock, uint64_t seed) {
    return verifiedRoundTrip(sock, seed, "healthy-", 42);
}

}  // namespace

TEST(DeadClient, KilledClientReleasesEverything) {
    Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    // A long-lived client that must carry on.
    auto keeper = tensorlane::Client::connect(sc.socket());
    ASSERT_TRUE(keeper.ok());
    auto inbox = keeper->allocHost(64 << 20);
    ASSERT_TRUE(inbox.ok());
    ASSERT_TRUE(inbox->expose("inbox").ok());
    // The harness's readiness probe must be gone before the baseline: only the keeper remains.
    ASSERT_TRUE(eventually([&] { return clientCount(keeper->get()) == 1; }));
    const int fds_before = sc.openFds();
    const int maps_before = sc.shmMappings();
    const int shm_before = countEntries("/dev/shm", "tensorlane-");

    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    pid_t victim = forkClient([&]() -> int {
        tl_client *c = nullptr;
        if (tl_connect(sc.socket().c_str(), &c) != TL_OK) {
            return 1;
        }
        void *p = nullptr;
        tl_region r = 0, r2 = 0;
        void *p2 = nullptr;
        if (tl_alloc_host(c, 64 << 20, &p, &r) != TL_OK ||
            tl_alloc_host(c, 4 << 20, &p2, &r2) != TL_OK || tl_expose(c, r2, "victim") != TL_OK) {
            return 2;
        }
        fillRandom(p, 64 << 20, 3);
        tl_remote dst = 0;
        if (tl_lookup(c, tl_node_name(c), "inbox", &dst, nullptr) != TL_OK) {
            return 3;
        }
        bool signalled = false;
        for (;;) {  // writes in flight until we are killed
            tl_ticket t = 0;
            for (int i = 0; i < 32; ++i) {
                if (tl_write(c, r, 0, dst, 0, 64 << 20, i, &t) != TL_OK) {
                    break;
                }
            }
            if (!signalled) {
                [[maybe_unused]] ssize_t n = ::write(ready[1], "x", 1);
                signalled = true;
            }
            (void)tl_wait(c, t, 1000);
        }
    });
    char x;
    ASSERT_EQ(::read(ready[0], &x, 1), 1);
    EXPECT_GT(sc.shmMappings(), maps_before);  // the victim's buffers are mapped
    ::kill(victim, SIGKILL);
    EXPECT_EQ(waitChild(victim), 128 + SIGKILL);
    ::close(ready[0]);
    ::close(ready[1]);

    EXPECT_TRUE(eventually([&] { return clientCount(keeper->get()) == 1; }));
    EXPECT_TRUE(eventually([&] { return sc.openFds() == fds_before; }))
        << sc.openFds() << " fds vs " << fds_before;
    EXPECT_TRUE(eventually([&] { return sc.shmMappings() == maps_before; }))
        << sc.shmMappings() << " shm mappings vs " << maps_before;
    EXPECT_EQ(countEntries("/dev/shm", "tensorlane-"), shm_before);
    EXPECT_TRUE(sc.alive());
    EXPECT_TRUE(sc.logHas("client hung up"));
    // The victim's exposed region is gone; the keeper carries on.
    tl_remote r = 0;
    EXPECT_EQ(tl_lookup(keeper->get(), keeper->nodeName().c_str(), "victim", &r, nullptr),
              TL_ENOENT);
    EXPECT_TRUE(healthyRoundTrip(sc.socket(), 11));
}

/// The socket file's mode bits and group.
std::pair<unsigned, gid_t> socketMode(const std::string &path) {
    struct stat st {};
    ::stat(path.c_str(), &st);
    return {st.st_mode & 0777, st.st_gid};
}

TEST(Credentials, DefaultSocketLetsOnlyRootAndOurUidIn) {
    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root to run a client as another uid";
    }
    Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    EXPECT_EQ(socketMode(sc.socket()).first, 0600u);
    pid_t p = forkClient([&]() -> int {
        if (!becomeUser(65534, 65534, {})) {
            return 50;
        }
        tl_client *c = nullptr;
        // The file system says no before the credential check is even asked.
        return tl_connect(sc.socket().c_str(), &c) == TL_EPERM ? 0 : 1;
    });
    EXPECT_EQ(waitChild(p), 0);
    EXPECT_TRUE(healthyRoundTrip(sc.socket(), 1));
}

TEST(Credentials, AllowedUidConnectsAndOthersAreRefusedWithEperm) {
    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root to run a client as another uid";
    }
    // No chmod here: the sidecar itself must make the socket reachable for allowed_uids.
    Sidecar sc(SidecarOptions{.extra_security = "allowed_uids = [65534]"});
    ASSERT_TRUE(sc.ready()) << sc.log();
    EXPECT_EQ(socketMode(sc.socket()).first, 0666u);
    pid_t ok = forkClient([&]() -> int {
        if (!becomeUser(65534, 65534, {})) {
            return 50;
        }
        return healthyRoundTrip(sc.socket(), 5) ? 0 : 1;
    });
    EXPECT_EQ(waitChild(ok), 0) << sc.log();
    pid_t refused = forkClient([&]() -> int {
        if (!becomeUser(65533, 65533, {})) {
            return 50;
        }
        tl_client *c = nullptr;
        if (tl_connect(sc.socket().c_str(), &c) != TL_EPERM) {
            return 1;
        }
        return std::string(tl_last_error()).find("not allowed") != std::string::npos ? 0 : 2;
    });
    EXPECT_EQ(waitChild(refused), 0);
    EXPECT_TRUE(sc.logHas("refused pid"));
}

TEST(Credentials, SupplementaryGroupIsEnough) {
    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root to run a client as another uid";
    }
    // One allowed group: the socket is 0660 with that group, and a client whose primary gid is
    // something else but which is a member of the group is served (only primary gids were
    // checked before).
    constexpr gid_t kGroup = 4242;
    Sidecar sc(SidecarOptions{.extra_security = "allowed_gids = [4242]"});
    ASSERT_TRUE(sc.ready()) << sc.log();
    EXPECT_EQ(socketMode(sc.socket()), std::make_pair(0660u, kGroup));
    pid_t member = forkClient([&]() -> int {
        if (!becomeUser(65534, 65534, {kGroup})) {
            return 50;
        }
        return healthyRoundTrip(sc.socket(), 6) ? 0 : 1;
    });
    EXPECT_EQ(waitChild(member), 0) << sc.log();
    pid_t stranger = forkClient([&]() -> int {
        if (!becomeUser(65534, 65534, {})) {
            return 50;
        }
        tl_client *c = nullptr;
        return tl_connect(sc.socket().c_str(), &c) == TL_EPERM ? 0 : 1;
    });
    EXPECT_EQ(waitChild(stranger), 0);
}

TEST(Credentials, SeveralGroupsAreCheckedByTheSidecar) {
    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root to run a client as another uid";
    }
    // Two groups cannot be one file mode: the socket is 0666 and the check is the sidecar's.
    Sidecar sc(SidecarOptions{.extra_security = "allowed_gids = [4242, 4343]"});
    ASSERT_TRUE(sc.ready()) << sc.log();
    EXPECT_EQ(socketMode(sc.socket()).first, 0666u);
    pid_t member = forkClient([&]() -> int {
        if (!becomeUser(65534, 65534, {17, 4343})) {
            return 50;
        }
        return healthyRoundTrip(sc.socket(), 7) ? 0 : 1;
    });
    EXPECT_EQ(waitChild(member), 0) << sc.log();
    pid_t stranger = forkClient([&]() -> int {
        if (!becomeUser(65534, 65534, {17})) {
            return 50;
        }
        tl_client *c = nullptr;
        if (tl_connect(sc.socket().c_str(), &c) != TL_EPERM) {
            return 1;
        }
        return std::string(tl_last_error()).find("supplementary") != std::string::npos ? 0 : 2;
    });
    EXPECT_EQ(waitChild(stranger), 0);
}

/// Writes `r` into request slot `pos` of a raw client and publishes it the way the ring does:
/// the payload, then the slot's sequence word (release). No doorbell.
void rawPublish(RawClient &raw, uint64_t pos, const ipc::Request &r) {
    ipc::Request &slot = raw.view.requests[pos & (raw.geometry.request_depth - 1)];
    std::memcpy(&slot, &r, offsetof(ipc::Request, ring_seq));
    std::atomic_ref<uint64_t>(slot.ring_seq).store(pos + 1, std::memory_order_release);
}

/// Publishes a no-op into request slot `pos` of a raw client and rings the doorbell.
void rawNop(RawClient &raw, uint64_t pos, uint64_t ticket) {
    ipc::Request nop{};
    nop.op = static_cast<uint32_t>(ipc::Op::kNop);
    nop.ticket = ticket;
    rawPublish(raw, pos, nop);
    raw.doorbell();
}

/// Whether completion `pos` arrives with `ticket` and TL_OK within `ms`.
bool rawCompleted(RawClient &raw, uint64_t pos, uint64_t ticket, int32_t want_status = 0) {
    const uint32_t mask = raw.geometry.completion_depth - 1;
    const ipc::Completion *c = &raw.view.completions[pos & mask];
    if (!eventually([&] {
            return std::atomic_ref<uint64_t>(const_cast<ipc::Completion *>(c)->ring_seq)
                       .load(std::memory_order_acquire) == pos + 1;
        })) {
        return false;
    }
    return c->ticket == ticket && c->status == want_status;
}

TEST(HostileClient, RandomRequestEntriesGetErrorCompletions) {
    Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    RawClient raw;
    ASSERT_TRUE(raw.connect(sc.socket()));
    std::mt19937_64 rng(7);
    auto *ctl = raw.view.request_ctl;
    const uint32_t depth = raw.geometry.request_depth;
    uint64_t tail = 0;
    uint64_t sent = 0;
    uint64_t chead = 0;
    for (int round = 0; round < 20; ++round) {
        for (uint32_t i = 0; i < depth / 2; ++i) {
            ipc::Request r;
            uint64_t words[8];
            for (auto &w : words) {
                w = rng();
            }
            std::memcpy(&r, words, sizeof(r));
            if (i % 4 == 0) {
                r.op = static_cast<uint32_t>(ipc::Op::kWrite);  // plausible op, bogus fields
            }
            rawPublish(raw, tail, r);
            ++tail;
            ++sent;
        }
        ctl->tail.value.store(tail, std::memory_order_release);
        raw.doorbell();
        // Each entry gets an error completion; drain them as a client would.
        auto *cctl = raw.view.completion_ctl;
        ASSERT_TRUE(eventually([&] {
            return cctl->tail.value.load(std::memory_order_acquire) == sent;
        })) << sc.log().substr(0, 3000);
        for (uint64_t i = chead; i < sent; ++i) {
            const ipc::Completion &c = raw.view.completions[i & (depth - 1)];
            EXPECT_NE(c.status, 0) << "entry " << i << " succeeded";
        }
        chead = sent;
        cctl->head.value.store(chead, std::memory_order_release);
    }
    EXPECT_EQ(ctl->head.value.load(std::memory_order_acquire), tail);
    EXPECT_TRUE(sc.alive());
    EXPECT_TRUE(sc.logHas("rejected"));
    EXPECT_TRUE(healthyRoundTrip(sc.socket(), 2));
}

TEST(HostileClient, RejectedEntriesAreCountedInTheMetricsByStatus) {
    // The sidecar's own refusals (entries the shim would never send) show in
    // tensorlane_requests_rejected_total, by tl_status name.
    const uint16_t port = freePort();
    Sidecar sc(SidecarOptions{.extra = "[metrics]\nlisten = \"127.0.0.1:" + std::to_string(port) +
                                       "\"\n"});
    ASSERT_TRUE(sc.ready()) << sc.log();
    RawClient raw;
    ASSERT_TRUE(raw.connect(sc.socket()));
    ipc::Request unknown_op{};
    unknown_op.op = 77;
    unknown_op.ticket = 1;
    ipc::Request no_region{};
    no_region.op = static_cast<uint32_t>(ipc::Op::kWrite);
    no_region.ticket = 2;
    no_region.src_region = 999999;
    no_region.bytes = 64;
    ipc::Request empty = no_region;
    empty.ticket = 3;
    empty.bytes = 0;
    rawPublish(raw, 0, unknown_op);
    rawPublish(raw, 1, no_region);
    rawPublish(raw, 2, empty);
    raw.doorbell();
    for (uint64_t i = 0; i < 3; ++i) {
        EXPECT_TRUE(rawCompleted(raw, i, i + 1, static_cast<int32_t>(TL_EINVAL)));
    }
    const HttpResponse r = httpGet("127.0.0.1", port, "/metrics");
    ASSERT_EQ(r.status, 200);
    EXPECT_NE(r.body.find("\ntensorlane_requests_rejected_total{status=\"TL_EINVAL\"} 3\n"),
              std::string::npos)
        << r.body;
    EXPECT_NE(r.body.find("\ntensorlane_requests_rejected_total{status=\"TL_ENOENT\"} 0\n"),
              std::string::npos);
}

TEST(HostileClient, ScribbledRequestTailIsIgnored) {
    Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    // The sidecar polls the request slots' sequence words, never the tail the client owns, so
    // a bogus tail (far ahead, behind, garbage) changes nothing: the session keeps working.
    RawClient a;
    ASSERT_TRUE(a.connect(sc.socket()));
    uint64_t pos = 0;
    for (uint64_t bogus : {uint64_t{1} << 40, ~uint64_t{0}, uint64_t{0xdeadbeef}}) {
        a.view.request_ctl->tail.value.store(bogus, std::memory_order_release);
        a.doorbell();
        rawNop(a, pos, 100 + pos);
        ASSERT_TRUE(rawCompleted(a, pos, 100 + pos)) << "tail " << bogus << "\n" << sc.log();
        ++pos;
        a.view.completion_ctl->head.value.store(pos, std::memory_order_release);
    }
    EXPECT_FALSE(a.hungUp(200));
    EXPECT_TRUE(sc.alive());
    EXPECT_TRUE(healthyRoundTrip(sc.socket(), 4));
}

TEST(HostileClient, ScribbledCursorsCloseOnlyThatSession) {
    Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    // A well-behaved client that stays connected throughout.
    RawClient good;
    ASSERT_TRUE(good.connect(sc.socket()));
    // Bogus completion head (the cursor the client owns): ahead of anything written.
    RawClient b;
    ASSERT_TRUE(b.connect(sc.socket()));
    b.view.completion_ctl->head.value.store(uint64_t{1} << 50, std::memory_order_release);
    rawNop(b, 0, 1);
    EXPECT_TRUE(b.hungUp(5000));
    // Random bytes over a whole segment, header and cursors included, then a valid request:
    // the first publish to it checks the heads it owns, finds garbage, closes it.
    RawClient c;
    ASSERT_TRUE(c.connect(sc.socket()));
    fillRandom(c.seg.data(), c.seg.size(), 99);
    rawNop(c, 0, 1);
    EXPECT_TRUE(c.hungUp(5000));
    for (const RawClient *bad : {&b, &c}) {
        EXPECT_TRUE(sc.logHas("session " + std::to_string(bad->session_id) + " (pid " +
                              std::to_string(::getpid()) + "): completion ring cursors corrupted"))
            << sc.log();
    }
    // The other session was not touched: it is still open and served.
    EXPECT_FALSE(good.hungUp(0));
    rawNop(good, 0, 5);
    EXPECT_TRUE(rawCompleted(good, 0, 5));
    EXPECT_TRUE(sc.alive());
    EXPECT_TRUE(healthyRoundTrip(sc.socket(), 3));
}

TEST(HostileClient, TruncatingItsSegmentsCannotCrashTheSidecar) {
    // A client holds read-write fds of its session segment and of its tl_alloc_host buffers.
    // Truncating them used to make the sidecar fault (SIGBUS) the next time it touched those
    // pages: in its sleep/wake path, and in a local copy. Sealed memfds refuse the resize.
    Sidecar sc(SidecarOptions{.poll_mode = "event"});
    ASSERT_TRUE(sc.ready()) << sc.log();
    auto owner = tensorlane::Client::connect(sc.socket());
    ASSERT_TRUE(owner.ok());
    auto inbox = owner->allocHost(1 << 20);
    ASSERT_TRUE(inbox.ok());
    ASSERT_TRUE(inbox->expose("inbox").ok());

    RawClient raw;
    ASSERT_TRUE(raw.connect(sc.socket()));
    EXPECT_EQ(::ftruncate(raw.seg_fd.get(), 0), -1);
    EXPECT_EQ(errno, EPERM);
    EXPECT_EQ(::ftruncate(raw.seg_fd.get(), 1 << 30), -1);
    EXPECT_EQ(errno, EPERM);
    ipc::UniqueFd buf_fd;
    ipc::Mapping buf;
    const uint64_t src = raw.allocHost(1 << 20, &buf_fd, &buf);
    ASSERT_NE(src, 0u);
    EXPECT_EQ(::ftruncate(buf_fd.get(), 0), -1);
    EXPECT_EQ(errno, EPERM);
    fillRandom(buf.data(), 1 << 20, 17);
    const uint64_t dst = raw.lookup("node-a", "inbox");
    ASSERT_NE(dst, 0u);
    // The sidecar sleeps (event mode) and wakes on the doorbell: it touches our header.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ipc::Request w{};
    w.op = static_cast<uint32_t>(ipc::Op::kWrite);
    w.ticket = 7;
    w.src_region = src;
    w.dst_remote = dst;
    w.bytes = 1 << 20;
    w.imm = 9;
    rawPublish(raw, 0, w);
    raw.doorbell();
    ASSERT_TRUE(rawCompleted(raw, 0, 7)) << sc.log();
    auto n = owner->waitNotification(std::chrono::seconds(5));
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(n->imm, 9u);
    EXPECT_EQ(std::memcmp(inbox->data(), buf.data(), 1 << 20), 0);
    EXPECT_TRUE(sc.alive());
    EXPECT_TRUE(healthyRoundTrip(sc.socket(), 8));
}

TEST(HostileClient, GarbageControlMessagesAreAnswered) {
    Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    RawClient raw;
    ASSERT_TRUE(raw.connect(sc.socket()));
    std::mt19937_64 rng(5);
    for (int i = 0; i < 200; ++i) {
        unsigned char buf[600];
        fillRandom(buf, sizeof(buf), rng());
        size_t len = 1 + rng() % sizeof(buf);
        if (i % 3 == 0 && len >= sizeof(ipc::MsgHeader)) {
            ipc::MsgHeader h{ipc::kControlMagic, ipc::kControlVersion,
                             static_cast<uint16_t>(1 + rng() % 9), static_cast<uint64_t>(i)};
            std::memcpy(buf, &h, sizeof(h));  // a valid header with a bogus body
        }
        ASSERT_EQ(ipc::sendMessage(raw.sock.get(), buf, len), 0);
        alignas(8) unsigned char reply[ipc::kMaxControlMessage];
        size_t got = 0;
        pollfd p{raw.sock.get(), POLLIN, 0};
        ASSERT_GT(::poll(&p, 1, 5000), 0);
        ASSERT_EQ(ipc::receiveMessage(raw.sock.get(), reply, sizeof(reply), &got, nullptr, nullptr),
                  0);
        ipc::ReplyMsg r;
        ASSERT_GE(got, sizeof(r));
        std::memcpy(&r, reply, sizeof(r));
        EXPECT_EQ(r.h.type, static_cast<uint16_t>(ipc::MsgType::kReply));
    }
    EXPECT_TRUE(sc.alive());
    EXPECT_TRUE(healthyRoundTrip(sc.socket(), 4));
}

// tests/fuzz/findings/control-reply-out-of-order: a datagram larger than the sidecar reads (a
// lookup header and 1.1 KiB after it) was refused with seq 0, which a client takes for a stale
// reply; the refusal must name the seq of the call it answers, and the session go on.
// The status document comes in pages of one snapshot (hundreds of peers take several): a page
// asked for out of turn or past the end is refused with the reason, and the session goes on.
TEST(HostileClient, StatusPagesOutOfTurnArePastTheDocument) {
    Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    RawClient raw;
    ASSERT_TRUE(raw.connect(sc.socket()));
    for (const uint32_t page : {1u, 7u, UINT32_MAX}) {
        ipc::StatusMsg m{};
        m.h.type = static_cast<uint16_t>(ipc::MsgType::kStatus);
        m.page = page;
        const ipc::ReplyMsg r = raw.call(m);
        EXPECT_EQ(r.status, static_cast<int32_t>(ipc::Code::kInvalid)) << page;
        EXPECT_NE(std::string(r.error).find("past the document"), std::string::npos) << r.error;
    }
    ipc::StatusMsg first{};
    first.h.type = static_cast<uint16_t>(ipc::MsgType::kStatus);
    const ipc::ReplyMsg whole = raw.call(first);
    EXPECT_EQ(whole.status, 0);
    EXPECT_GT(whole.value0, 0u);
    EXPECT_EQ(whole.value0, whole.value1) << "a small document is one page";
    ipc::StatusMsg again{};
    again.h.type = static_cast<uint16_t>(ipc::MsgType::kStatus);
    again.page = 1;  // the snapshot went with its last page
    EXPECT_EQ(raw.call(again).status, static_cast<int32_t>(ipc::Code::kInvalid));
    EXPECT_TRUE(sc.alive());
}

TEST(HostileClient, OversizedControlMessageIsRefusedWithItsSeq) {
    Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    RawClient raw;
    ASSERT_TRUE(raw.connect(sc.socket()));
    for (const size_t len : {size_t{1164}, size_t{4096}, ipc::kMaxControlMessage}) {
        std::vector<unsigned char> msg(len, 0);
        const uint64_t seq = raw.seq++;
        const ipc::MsgHeader h{ipc::kControlMagic, ipc::kControlVersion,
                               static_cast<uint16_t>(ipc::MsgType::kLookup), seq};
        std::memcpy(msg.data(), &h, sizeof(h));
        ASSERT_EQ(ipc::sendMessage(raw.sock.get(), msg.data(), msg.size()), 0) << len;
        pollfd p{raw.sock.get(), POLLIN, 0};
        ASSERT_GT(::poll(&p, 1, 5000), 0) << len;
        alignas(8) unsigned char reply[ipc::kMaxControlMessage];
        size_t got = 0;
        ASSERT_EQ(ipc::receiveMessage(raw.sock.get(), reply, sizeof(reply), &got, nullptr, nullptr),
                  0);
        ipc::ReplyMsg r;
        ASSERT_EQ(got, sizeof(r));
        std::memcpy(&r, reply, sizeof(r));
        EXPECT_EQ(r.h.type, static_cast<uint16_t>(ipc::MsgType::kReply));
        EXPECT_EQ(r.h.seq, seq) << len;
        EXPECT_EQ(r.status, static_cast<int32_t>(ipc::Code::kInvalid)) << len;
        EXPECT_STREQ(r.error, "control message too large") << len;
    }
    // The session still answers a call of the right size, with its seq.
    ipc::LookupMsg m{};
    m.h.type = static_cast<uint16_t>(ipc::MsgType::kLookup);
    ipc::copyName(m.peer, sizeof(m.peer), "nobody-here");
    ipc::copyName(m.name, sizeof(m.name), "nothing");
    const uint64_t want = raw.seq;
    const ipc::ReplyMsg r = raw.call(m);
    EXPECT_EQ(r.h.seq, want);
    // Not a configured peer: wrong on its face (issue 24: retrying cannot help).
    EXPECT_EQ(r.status, static_cast<int32_t>(ipc::Code::kInvalid)) << r.error;
    EXPECT_TRUE(sc.alive());
}

TEST(DeadSidecar, BlockedWaitReturnsEconnPromptly) {
    Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    auto c = tensorlane::Client::connect(sc.socket());
    ASSERT_TRUE(c.ok());
    // Freeze the sidecar so a no-op stays pending, then kill it under a blocked tl_wait.
    ASSERT_EQ(::kill(sc.pid(), SIGSTOP), 0);
    tl_ticket t = 0;
    ASSERT_EQ(tl_nop(c->get(), &t), TL_OK);
    std::atomic<int> result{-1};
    std::atomic<int> notif_result{-1};
    auto start = std::chrono::steady_clock::now();
    std::thread waiter([&] { result = tl_wait(c->get(), t, 30000); });
    std::thread notif([&] {
        tl_notification n;
        notif_result = tl_wait_notification(c->get(), &n, 30000);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_EQ(result.load(), -1);  // still blocked
    sc.kill(SIGKILL);
    waiter.join();
    notif.join();
    auto took = std::chrono::steady_clock::now() - start;
    EXPECT_EQ(result.load(), TL_ECONN);
    EXPECT_EQ(notif_result.load(), TL_ECONN);
    EXPECT_LT(took, std::chrono::seconds(3));
    // Every later call says the same.
    EXPECT_EQ(tl_nop(c->get(), &t), TL_ECONN);
    tl_remote r;
    EXPECT_EQ(tl_lookup(c->get(), "node-a", "x", &r, nullptr), TL_ECONN);
}

namespace {

/// A kVmmPieces message of `count` pieces of `piece` bytes from piece `first` on, every fd
/// `fd` (the sidecar checks the pieces' fds only when it maps them, with CUDA).
ipc::VmmPiecesMsg vmmPieces(uint64_t key, uint32_t first, uint32_t count, uint64_t piece) {
    ipc::VmmPiecesMsg m{};
    m.h.type = static_cast<uint16_t>(ipc::MsgType::kVmmPieces);
    m.key = key;
    m.first = first;
    m.count = count;
    for (uint32_t i = 0; i < count && i < ipc::kMaxVmmPiecesPerMessage; ++i) {
        m.pieces[i] = {(first + i) * piece, piece};
    }
    return m;
}

ipc::RegisterMsg vmmRegister(uint64_t key, uint64_t span) {
    ipc::RegisterMsg m{};
    m.h.type = static_cast<uint16_t>(ipc::MsgType::kRegister);
    m.kind = static_cast<uint32_t>(ipc::RegionKind::kCuda);
    m.flags = ipc::kRegisterVmm;
    m.parent = key;
    m.bytes = 4096;
    m.alloc_bytes = span;
    return m;
}

}  // namespace

// A client lying about a VMM registration's pieces (the fds the sidecar will map): every lie is
// refused with the reason, a refused batch drops what was staged, a registration consumes its
// pieces whatever becomes of it, and none of the fds outlives the session.
TEST(HostileClient, VmmPieceLiesAreRefusedAndTheirFdsClosed) {
    Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    // The harness's readiness probe must be gone before the baseline: only the keeper remains.
    auto keeper = tensorlane::Client::connect(sc.socket());
    ASSERT_TRUE(keeper.ok());
    ASSERT_TRUE(eventually([&] { return clientCount(keeper->get()) == 1; }));
    const int fds_before = sc.openFds();
    {
        RawClient raw;
        ASSERT_TRUE(raw.connect(sc.socket()));
        ipc::UniqueFd piece(::memfd_create("tl-piece", MFD_CLOEXEC));
        ASSERT_TRUE(piece);
        std::vector<int> fds(ipc::kMaxVmmPiecesPerMessage, piece.get());
        const auto code = [](const ipc::ReplyMsg &r) { return static_cast<ipc::Code>(r.status); };
        constexpr uint64_t kPiece = 2 << 20;

        // Fewer fds than pieces, and no piece at all.
        ipc::VmmPiecesMsg m = vmmPieces(1, 0, 2, kPiece);
        ipc::ReplyMsg r = raw.call(m, nullptr, std::span<const int>(fds.data(), 1));
        EXPECT_EQ(code(r), ipc::Code::kInvalid) << r.error;
        EXPECT_NE(std::string(r.error).find("one fd each"), std::string::npos) << r.error;
        m = vmmPieces(1, 0, 0, kPiece);
        r = raw.call(m);
        EXPECT_EQ(code(r), ipc::Code::kInvalid) << r.error;
        // A gap between pieces, an empty piece, a span past 2^48.
        m = vmmPieces(2, 0, 3, kPiece);
        m.pieces[2].offset += 4096;
        r = raw.call(m, nullptr, std::span<const int>(fds.data(), 3));
        EXPECT_EQ(code(r), ipc::Code::kInvalid) << r.error;
        EXPECT_NE(std::string(r.error).find("piece 2"), std::string::npos) << r.error;
        m = vmmPieces(2, 0, 1, 0);
        r = raw.call(m, nullptr, std::span<const int>(fds.data(), 1));
        EXPECT_EQ(code(r), ipc::Code::kInvalid) << r.error;
        m = vmmPieces(2, 0, 1, uint64_t{1} << 49);
        r = raw.call(m, nullptr, std::span<const int>(fds.data(), 1));
        EXPECT_EQ(code(r), ipc::Code::kInvalid) << r.error;

        // Two good batches, then one that skips ahead: refused, and the staging is gone (a
        // batch that would follow the first two no longer does).
        for (uint32_t first : {0u, 32u}) {
            m = vmmPieces(3, first, 32, kPiece);
            r = raw.call(m, nullptr, fds);
            ASSERT_EQ(code(r), ipc::Code::kOk) << r.error;
            EXPECT_EQ(r.value0, first + 32);
            EXPECT_EQ(r.value1, (first + 32) * kPiece);
        }
        m = vmmPieces(3, 65, 1, kPiece);
        r = raw.call(m, nullptr, std::span<const int>(fds.data(), 1));
        EXPECT_EQ(code(r), ipc::Code::kInvalid) << r.error;
        EXPECT_NE(std::string(r.error).find("64 are staged"), std::string::npos) << r.error;
        m = vmmPieces(3, 64, 1, kPiece);
        r = raw.call(m, nullptr, std::span<const int>(fds.data(), 1));
        EXPECT_EQ(code(r), ipc::Code::kInvalid) << r.error;
        EXPECT_NE(std::string(r.error).find("0 are staged"), std::string::npos) << r.error;

        // A registration with nothing staged; one whose span disagrees with its pieces; one
        // that matches (this sidecar has no CUDA, so it is refused for that): each takes the
        // pieces with it.
        ipc::RegisterMsg reg = vmmRegister(4, kPiece);
        r = raw.call(reg);
        EXPECT_EQ(code(r), ipc::Code::kNotFound) << r.error;
        m = vmmPieces(5, 0, 2, kPiece);
        ASSERT_EQ(code(raw.call(m, nullptr, std::span<const int>(fds.data(), 2))), ipc::Code::kOk);
        reg = vmmRegister(5, 3 * kPiece);
        r = raw.call(reg);
        EXPECT_EQ(code(r), ipc::Code::kInvalid) << r.error;
        EXPECT_NE(std::string(r.error).find("span 4194304 bytes"), std::string::npos) << r.error;
        reg = vmmRegister(5, 2 * kPiece);
        EXPECT_EQ(code(raw.call(reg)), ipc::Code::kNotFound);
        m = vmmPieces(6, 0, 2, kPiece);
        ASSERT_EQ(code(raw.call(m, nullptr, std::span<const int>(fds.data(), 2))), ipc::Code::kOk);
        reg = vmmRegister(6, 2 * kPiece);
        reg.flags |= ipc::kRegisterReuse;  // flags that cannot go together
        r = raw.call(reg);
        EXPECT_EQ(code(r), ipc::Code::kInvalid) << r.error;
        reg = vmmRegister(6, 2 * kPiece);
        EXPECT_EQ(code(raw.call(reg)), ipc::Code::kNotFound);
        m = vmmPieces(7, 0, 2, kPiece);
        ASSERT_EQ(code(raw.call(m, nullptr, std::span<const int>(fds.data(), 2))), ipc::Code::kOk);
        reg = vmmRegister(7, 2 * kPiece);
        r = raw.call(reg);
        EXPECT_EQ(code(r), ipc::Code::kCuda) << r.error;
        EXPECT_NE(std::string(r.error).find("cannot use CUDA memory"), std::string::npos)
            << r.error;

        // Host memory by VMM: the flag without kRegisterVmm is refused before anything else;
        // with it, the pieces go with the registration as for device memory (refused here for
        // want of CUDA).
        reg = vmmRegister(10, kPiece);
        reg.flags = ipc::kRegisterVmmHost;
        r = raw.call(reg);
        EXPECT_EQ(code(r), ipc::Code::kInvalid) << r.error;
        EXPECT_NE(std::string(r.error).find("without its VMM pieces"), std::string::npos)
            << r.error;
        m = vmmPieces(11, 0, 2, kPiece);
        ASSERT_EQ(code(raw.call(m, nullptr, std::span<const int>(fds.data(), 2))), ipc::Code::kOk);
        reg = vmmRegister(11, 2 * kPiece);
        reg.flags |= ipc::kRegisterVmmHost;
        r = raw.call(reg);
        EXPECT_EQ(code(r), ipc::Code::kCuda) << r.error;
        reg = vmmRegister(11, 2 * kPiece);
        EXPECT_EQ(code(raw.call(reg)), ipc::Code::kNotFound) << "the pieces went with it";

        // Fds on messages that carry none, and two on a registration.
        ipc::LookupMsg lm{};
        lm.h.type = static_cast<uint16_t>(ipc::MsgType::kLookup);
        r = raw.call(lm, nullptr, std::span<const int>(fds.data(), 1));
        EXPECT_STREQ(r.error, "unexpected file descriptors");
        reg = vmmRegister(8, kPiece);
        r = raw.call(reg, nullptr, std::span<const int>(fds.data(), 2));
        EXPECT_STREQ(r.error, "unexpected file descriptors");

        // Pieces staged and never registered stay until the session ends; then they close.
        m = vmmPieces(9, 0, 32, kPiece);
        ASSERT_EQ(code(raw.call(m, nullptr, fds)), ipc::Code::kOk);
        EXPECT_GE(sc.openFds(), fds_before + 32);
    }
    EXPECT_TRUE(eventually([&] { return sc.openFds() == fds_before; }))
        << sc.openFds() << " fds, " << fds_before << " before";
    EXPECT_TRUE(sc.alive());
    EXPECT_TRUE(healthyRoundTrip(sc.socket(), 9));
}

// One client may stage at most kMaxVmmPieces pieces (each an fd in the sidecar): the next is
// refused, and the session, and every other, goes on.
TEST(HostileClient, VmmStagingIsBoundedPerClient) {
    Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    rlimit lim{};
    ASSERT_EQ(::prlimit(sc.pid(), RLIMIT_NOFILE, nullptr, &lim), 0);
    if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < ipc::kMaxVmmPieces + 1024) {
        GTEST_SKIP() << "the sidecar may open " << lim.rlim_cur << " fds (RLIMIT_NOFILE), fewer "
                     << "than one client's " << ipc::kMaxVmmPieces << " staged pieces";
    }
    // The harness's readiness probe must be gone before the baseline: only the keeper remains.
    auto keeper = tensorlane::Client::connect(sc.socket());
    ASSERT_TRUE(keeper.ok());
    ASSERT_TRUE(eventually([&] { return clientCount(keeper->get()) == 1; }));
    const int fds_before = sc.openFds();
    {
        RawClient raw;
        ASSERT_TRUE(raw.connect(sc.socket()));
        ipc::UniqueFd piece(::memfd_create("tl-piece", MFD_CLOEXEC));
        std::vector<int> fds(ipc::kMaxVmmPiecesPerMessage, piece.get());
        constexpr uint32_t kBatch = ipc::kMaxVmmPiecesPerMessage;
        for (uint32_t first = 0; first < ipc::kMaxVmmPieces; first += kBatch) {
            // Two registrations' worth, so the bound is the client's, not one registration's.
            ipc::VmmPiecesMsg m = vmmPieces(first < ipc::kMaxVmmPieces / 2 ? 1 : 2,
                                            first % (ipc::kMaxVmmPieces / 2), kBatch, 4096);
            const ipc::ReplyMsg r = raw.call(m, nullptr, fds);
            ASSERT_EQ(r.status, 0) << first << ": " << r.error;
        }
        ipc::VmmPiecesMsg m = vmmPieces(3, 0, 1, 4096);
        ipc::ReplyMsg r = raw.call(m, nullptr, std::span<const int>(fds.data(), 1));
        EXPECT_EQ(static_cast<ipc::Code>(r.status), ipc::Code::kInvalid) << r.error;
        EXPECT_NE(std::string(r.error).find("VMM pieces staged by this client"), std::string::npos)
            << r.error;
        EXPECT_TRUE(healthyRoundTrip(sc.socket(), 11));
    }
    EXPECT_TRUE(eventually([&] { return sc.openFds() == fds_before; }))
        << sc.openFds() << " fds, " << fds_before << " before";
}
