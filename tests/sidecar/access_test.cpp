// Who may write an exposed region (DESIGN.md, "Locally, an exposed region is writable by its
// owner's uid and root; other local uids only when the owner grants them"): real sidecars, and
// clients forked as other uids. tl_expose_access, the writer's uid in notifications, and
// [security] reserved_names.
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <grp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "tensorlane/tensorlane.h"
#include "tensorlane/tensorlane.hpp"

using namespace tltest;

namespace {

constexpr uid_t kUidA = 65534;
constexpr uid_t kUidB = 65533;
constexpr uid_t kUidC = 65532;
constexpr gid_t kGroup = 4242;
constexpr size_t kSlot = 4096;
const std::string kAllowAll = "allowed_uids = [65534, 65533, 65532]";

/// A pipe for a forked child to report to the parent (or the parent to release a child).
struct Pipe {
    int fd[2] = {-1, -1};
    Pipe() { [[maybe_unused]] int rc = ::pipe(fd); }
    ~Pipe() {
        ::close(fd[0]);
        ::close(fd[1]);
    }
    void send(const std::string &s) const {
        const uint32_t n = static_cast<uint32_t>(s.size());
        [[maybe_unused]] ssize_t a = ::write(fd[1], &n, sizeof(n));
        [[maybe_unused]] ssize_t b = ::write(fd[1], s.data(), s.size());
    }
    /// The next message, or "<timeout>".
    std::string receive(int timeout_ms = 20000) const {
        pollfd p{fd[0], POLLIN, 0};
        uint32_t n = 0;
        if (::poll(&p, 1, timeout_ms) <= 0 || ::read(fd[0], &n, sizeof(n)) != sizeof(n)) {
            return "<timeout>";
        }
        std::string s(n, '\0');
        size_t got = 0;
        while (got < n) {
            ssize_t r = ::read(fd[0], s.data() + got, n - got);
            if (r <= 0) {
                break;
            }
            got += static_cast<size_t>(r);
        }
        return s;
    }
};

/// What one writer saw: its lookup's status, its write's, and the detail of the first failure.
struct Attempt {
    tl_status lookup = TL_EINTERNAL;
    tl_status write = TL_EINTERNAL;
    std::string error;
    int exit = -1;
};

/// Forks a client as `uid` (groups `groups`) that looks up `name` on `node` and writes kSlot
/// bytes of pattern `seed` at `offset` with immediate `imm`.
Attempt writeAs(const std::string &socket, const std::string &node, const std::string &name,
                uid_t uid, std::vector<gid_t> groups, uint64_t offset, uint64_t seed,
                uint32_t imm) {
    Pipe out;
    pid_t pid = forkClient([&]() -> int {
        if (!becomeUser(uid, uid, groups)) {
            out.send("50 50 cannot become uid " + std::to_string(uid));
            return 50;
        }
        tl_client *c = nullptr;
        if (tl_connect(socket.c_str(), &c) != TL_OK) {
            out.send("51 51 connect: " + std::string(tl_last_error()));
            return 51;
        }
        void *src = nullptr;
        tl_region rsrc = 0;
        if (tl_alloc_host(c, kSlot, &src, &rsrc) != TL_OK) {
            out.send("52 52 alloc: " + std::string(tl_last_error()));
            return 52;
        }
        fillRandom(src, kSlot, seed);
        tl_remote dst = 0;
        tl_status ls = lookupEventually(c, node.c_str(), name.c_str(), &dst, nullptr);
        if (ls != TL_OK) {
            out.send(std::to_string(ls) + " 99 " + tl_last_error());
            return 0;
        }
        tl_ticket t = 0;
        tl_status ws = tl_write(c, rsrc, 0, dst, offset, kSlot, imm, &t);
        if (ws == TL_OK) {
            ws = tl_wait(c, t, 10000);
        }
        out.send("0 " + std::to_string(ws) + " " + (ws == TL_OK ? "" : tl_last_error()));
        tl_disconnect(c);
        return 0;
    });
    Attempt a;
    const std::string msg = out.receive();
    a.exit = waitChild(pid);
    int l = 0, w = 0, used = 0;
    if (std::sscanf(msg.c_str(), "%d %d %n", &l, &w, &used) >= 2) {
        a.lookup = static_cast<tl_status>(l);
        a.write = static_cast<tl_status>(w);
        a.error = msg.substr(static_cast<size_t>(used));
    } else {
        a.error = msg;
    }
    return a;
}

bool contains(const std::string &s, const std::string &part) {
    return s.find(part) != std::string::npos;
}

bool allZero(const void *p, size_t n) {
    const auto *b = static_cast<const unsigned char *>(p);
    for (size_t i = 0; i < n; ++i) {
        if (b[i] != 0) {
            return false;
        }
    }
    return true;
}

bool samePattern(const void *p, size_t n, uint64_t seed) {
    std::vector<unsigned char> want(n);
    fillRandom(want.data(), n, seed);
    return std::memcmp(p, want.data(), n) == 0;
}

/// An inbox exposed by this (root) process: one region of `slots` kSlot slots, zeroed.
struct Inbox {
    tensorlane::Client client;
    tensorlane::Region region;
};

Inbox makeInbox(const std::string &socket, size_t slots) {
    auto c = tensorlane::Client::connect(socket);
    EXPECT_TRUE(c.ok()) << c.error().detail;
    auto r = c->allocHost(slots * kSlot);
    EXPECT_TRUE(r.ok()) << r.error().detail;
    std::memset(r->data(), 0, slots * kSlot);
    return Inbox{std::move(*c), std::move(*r)};
}

#define TL_NEEDS_ROOT()                                                \
    do {                                                               \
        if (::geteuid() != 0) {                                        \
            GTEST_SKIP() << "needs root to run clients as other uids"; \
        }                                                              \
    } while (0)

}  // namespace

TEST(Access, DefaultExposeLetsOnlyTheOwnersUidAndRootWrite) {
    TL_NEEDS_ROOT();
    Sidecar sc(SidecarOptions{.extra_security = kAllowAll});
    ASSERT_TRUE(sc.ready()) << sc.log();
    // The owner is uid A (not root): it exposes with plain tl_expose and reports what landed.
    Pipe ready, report;
    pid_t owner = forkClient([&]() -> int {
        if (!becomeUser(kUidA, kUidA, {})) {
            return 50;
        }
        tl_client *c = nullptr;
        void *inbox = nullptr;
        tl_region r = 0;
        if (tl_connect(sc.socket().c_str(), &c) != TL_OK ||
            tl_alloc_host(c, 3 * kSlot, &inbox, &r) != TL_OK) {
            return 51;
        }
        std::memset(inbox, 0, 3 * kSlot);
        if (tl_expose(c, r, "acc.mine") != TL_OK) {
            return 52;
        }
        ready.send("ready");
        // Two writes must land: root's (slot 0) and another process of uid A (slot 1).
        std::vector<uint32_t> uids;
        for (int i = 0; i < 2; ++i) {
            tl_notification_ex n{};
            if (tl_wait_notification_ex(c, &n, 15000) != TL_OK) {
                report.send("missing notification " + std::to_string(i));
                return 0;
            }
            uids.push_back(n.writer_uid);
        }
        // Let a refused write have its chance to land, then look.
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        tl_notification_ex extra{};
        const bool more = tl_wait_notification_ex(c, &extra, 0) == TL_OK;
        const auto *b = static_cast<unsigned char *>(inbox);
        std::string verdict =
            std::string(samePattern(b, kSlot, 1) ? "root-landed " : "root-missing ") +
            (samePattern(b + kSlot, kSlot, 2) ? "a-landed " : "a-missing ") +
            (allZero(b + 2 * kSlot, kSlot) ? "b-untouched " : "b-wrote ") +
            (more ? "extra-notification " : "") + "uids";
        std::sort(uids.begin(), uids.end());
        for (uint32_t u : uids) {
            verdict += " " + std::to_string(u);
        }
        report.send(verdict);
        return 0;
    });
    ASSERT_EQ(ready.receive(), "ready");
    // Root may always write.
    {
        auto c = tensorlane::Client::connect(sc.socket());
        ASSERT_TRUE(c.ok());
        auto src = c->allocHost(kSlot);
        ASSERT_TRUE(src.ok());
        fillRandom(src->data(), kSlot, 1);
        auto dst = c->lookup("node-a", "acc.mine");
        ASSERT_TRUE(dst.ok()) << dst.error().detail;
        auto t = c->write(*src, 0, *dst, 0, kSlot, 1);
        ASSERT_TRUE(t.ok());
        EXPECT_EQ(t->wait(std::chrono::seconds(10)), TL_OK);
    }
    // Another process of the owner's uid may.
    Attempt same = writeAs(sc.socket(), "node-a", "acc.mine", kUidA, {}, kSlot, 2, 2);
    EXPECT_EQ(same.lookup, TL_OK) << same.error;
    EXPECT_EQ(same.write, TL_OK) << same.error;
    // Another uid may not: refused at lookup, with the owner's list and the call to change it.
    Attempt other = writeAs(sc.socket(), "node-a", "acc.mine", kUidB, {}, 2 * kSlot, 3, 3);
    EXPECT_EQ(other.lookup, TL_EPERM) << other.error;
    EXPECT_TRUE(contains(other.error, "owner uid 65534")) << other.error;
    EXPECT_TRUE(contains(other.error, "tl_expose_access")) << other.error;
    EXPECT_EQ(report.receive(), "root-landed a-landed b-untouched uids 0 65534") << sc.log();
    EXPECT_EQ(waitChild(owner), 0);
}

TEST(Access, ListedUidsAndGroupsMayWriteOthersMayNot) {
    TL_NEEDS_ROOT();
    Sidecar sc(SidecarOptions{.extra_security = kAllowAll});
    ASSERT_TRUE(sc.ready()) << sc.log();
    Inbox in = makeInbox(sc.socket(), 3);
    ASSERT_TRUE(
        in.region.expose("acc.listed", tensorlane::Access{.uids = {kUidA}, .gids = {kGroup}}).ok());
    // Listed by uid.
    Attempt a = writeAs(sc.socket(), "node-a", "acc.listed", kUidA, {}, 0, 11, 11);
    EXPECT_EQ(a.lookup, TL_OK) << a.error;
    EXPECT_EQ(a.write, TL_OK) << a.error;
    // Listed through a supplementary group only.
    Attempt b = writeAs(sc.socket(), "node-a", "acc.listed", kUidB, {17, kGroup}, kSlot, 12, 12);
    EXPECT_EQ(b.lookup, TL_OK) << b.error;
    EXPECT_EQ(b.write, TL_OK) << b.error;
    // Neither.
    Attempt c = writeAs(sc.socket(), "node-a", "acc.listed", kUidC, {17}, 2 * kSlot, 13, 13);
    EXPECT_EQ(c.lookup, TL_EPERM) << c.error;
    EXPECT_TRUE(contains(c.error, "uids [65534], gids [4242]")) << c.error;
    std::vector<uint32_t> writers;
    for (int i = 0; i < 2; ++i) {
        auto n = in.client.waitNotificationEx(std::chrono::seconds(10));
        ASSERT_TRUE(n.ok()) << n.error().detail;
        writers.push_back(n->writer_uid);
    }
    std::sort(writers.begin(), writers.end());
    EXPECT_EQ(writers, (std::vector<uint32_t>{kUidB, kUidA}));
    const auto *bytes = static_cast<unsigned char *>(in.region.data());
    EXPECT_TRUE(samePattern(bytes, kSlot, 11));
    EXPECT_TRUE(samePattern(bytes + kSlot, kSlot, 12));
    EXPECT_TRUE(allZero(bytes + 2 * kSlot, kSlot));
}

TEST(Access, LocalAnyLetsEveryAdmittedClientWrite) {
    TL_NEEDS_ROOT();
    Sidecar sc(SidecarOptions{.extra_security = kAllowAll});
    ASSERT_TRUE(sc.ready()) << sc.log();
    Inbox in = makeInbox(sc.socket(), 2);
    ASSERT_TRUE(in.region.expose("acc.any", tensorlane::Access{.any_local = true}).ok());
    Attempt b = writeAs(sc.socket(), "node-a", "acc.any", kUidB, {}, 0, 21, 21);
    EXPECT_EQ(b.lookup, TL_OK) << b.error;
    EXPECT_EQ(b.write, TL_OK) << b.error;
    Attempt c = writeAs(sc.socket(), "node-a", "acc.any", kUidC, {}, kSlot, 22, 22);
    EXPECT_EQ(c.write, TL_OK) << c.error;
    const auto *bytes = static_cast<unsigned char *>(in.region.data());
    EXPECT_TRUE(samePattern(bytes, kSlot, 21));
    EXPECT_TRUE(samePattern(bytes + kSlot, kSlot, 22));
}

TEST(Access, NarrowingTheListRefusesTheNextWrite) {
    TL_NEEDS_ROOT();
    Sidecar sc(SidecarOptions{.extra_security = kAllowAll});
    ASSERT_TRUE(sc.ready()) << sc.log();
    Inbox in = makeInbox(sc.socket(), 2);
    ASSERT_TRUE(in.region.expose("acc.narrow", tensorlane::Access{.uids = {kUidB}}).ok());
    Pipe first, go, second;
    pid_t writer = forkClient([&]() -> int {
        if (!becomeUser(kUidB, kUidB, {})) {
            return 50;
        }
        tl_client *c = nullptr;
        void *src = nullptr;
        tl_region rsrc = 0;
        tl_remote dst = 0;
        if (tl_connect(sc.socket().c_str(), &c) != TL_OK ||
            tl_alloc_host(c, kSlot, &src, &rsrc) != TL_OK ||
            tl_lookup(c, "node-a", "acc.narrow", &dst, nullptr) != TL_OK) {
            first.send(std::string("setup: ") + tl_last_error());
            return 51;
        }
        fillRandom(src, kSlot, 31);
        tl_ticket t = 0;
        tl_status s = tl_write(c, rsrc, 0, dst, 0, kSlot, 31, &t);
        first.send(std::to_string(s == TL_OK ? tl_wait(c, t, 10000) : s));
        if (go.receive() != "go") {
            return 52;
        }
        s = tl_write(c, rsrc, 0, dst, kSlot, kSlot, 32, &t);
        if (s == TL_OK) {
            s = tl_wait(c, t, 10000);
        }
        second.send(std::to_string(s) + " " + tl_last_error());
        return 0;
    });
    EXPECT_EQ(first.receive(), std::to_string(TL_OK));
    // The owner exposes it again with the default list: uid B is no longer in it.
    ASSERT_TRUE(in.region.expose("acc.narrow").ok());
    go.send("go");
    const std::string s = second.receive();
    EXPECT_EQ(s.substr(0, s.find(' ')), std::to_string(TL_EPERM)) << s;
    EXPECT_TRUE(contains(s, "tl_expose_access")) << s;
    EXPECT_EQ(waitChild(writer), 0);
    const auto *bytes = static_cast<unsigned char *>(in.region.data());
    EXPECT_TRUE(samePattern(bytes, kSlot, 31));
    EXPECT_TRUE(allZero(bytes + kSlot, kSlot));
}

TEST(Access, BadAccessListsAreRefusedWithTheReason) {
    Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    tl_client *c = nullptr;
    ASSERT_EQ(tl_connect(sc.socket().c_str(), &c), TL_OK);
    void *p = nullptr;
    tl_region r = 0;
    ASSERT_EQ(tl_alloc_host(c, kSlot, &p, &r), TL_OK);
    std::vector<uint32_t> many(TL_ACCESS_MAX_IDS + 1, 1000);
    tl_access a{};
    a.flags = TL_ACCESS_PEERS;
    a.n_uids = static_cast<uint32_t>(many.size());
    a.uids = many.data();
    EXPECT_EQ(tl_expose_access(c, r, "acc.bad", &a), TL_EINVAL);
    EXPECT_TRUE(contains(tl_last_error(), "at most 64")) << tl_last_error();
    a.n_uids = 0;
    a.flags = 0x80;
    EXPECT_EQ(tl_expose_access(c, r, "acc.bad", &a), TL_EINVAL);
    EXPECT_TRUE(contains(tl_last_error(), "unknown flags")) << tl_last_error();
    a.flags = TL_ACCESS_PEERS;
    a.n_gids = 1;
    a.gids = nullptr;
    EXPECT_EQ(tl_expose_access(c, r, "acc.bad", &a), TL_EINVAL);
    // A region offered to peers cannot be withdrawn from them by exposing it again.
    a.n_gids = 0;
    ASSERT_EQ(tl_expose_access(c, r, "acc.bad", &a), TL_OK);
    a.flags = 0;
    EXPECT_EQ(tl_expose_access(c, r, "acc.bad", &a), TL_EINVAL);
    EXPECT_TRUE(contains(tl_last_error(), "cannot be withdrawn")) << tl_last_error();
    // NULL: tl_expose's default.
    EXPECT_EQ(tl_expose_access(c, r, "acc.bad", nullptr), TL_OK);
    tl_disconnect(c);
}

TEST(Access, ANameExposedByAnotherUidIsNotTakenOver) {
    TL_NEEDS_ROOT();
    Sidecar sc(SidecarOptions{.extra_security = kAllowAll});
    ASSERT_TRUE(sc.ready()) << sc.log();
    Inbox in = makeInbox(sc.socket(), 1);
    ASSERT_TRUE(in.region.expose("acc.taken").ok());
    Pipe out;
    pid_t squatter = forkClient([&]() -> int {
        if (!becomeUser(kUidB, kUidB, {})) {
            return 50;
        }
        tl_client *c = nullptr;
        void *p = nullptr;
        tl_region r = 0;
        if (tl_connect(sc.socket().c_str(), &c) != TL_OK ||
            tl_alloc_host(c, kSlot, &p, &r) != TL_OK) {
            return 51;
        }
        tl_access any{TL_ACCESS_PEERS | TL_ACCESS_LOCAL_ANY, 0, nullptr, 0, nullptr};
        tl_status s = tl_expose_access(c, r, "acc.taken", &any);
        out.send(std::to_string(s) + " " + tl_last_error());
        return 0;
    });
    const std::string s = out.receive();
    EXPECT_EQ(waitChild(squatter), 0);
    EXPECT_EQ(s.substr(0, s.find(' ')), std::to_string(TL_EINVAL)) << s;
    EXPECT_TRUE(contains(s, "already exposed")) << s;
    EXPECT_TRUE(contains(s, "owner uid 0")) << s;
    // The name still leads to the first owner's region.
    auto c = tensorlane::Client::connect(sc.socket());
    ASSERT_TRUE(c.ok());
    auto src = c->allocHost(kSlot);
    ASSERT_TRUE(src.ok());
    fillRandom(src->data(), kSlot, 41);
    auto dst = c->lookup("node-a", "acc.taken");
    ASSERT_TRUE(dst.ok());
    auto t = c->write(*src, 0, *dst, 0, kSlot, 41);
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(t->wait(std::chrono::seconds(10)), TL_OK);
    EXPECT_TRUE(samePattern(in.region.data(), kSlot, 41));
}

TEST(Access, AReservedPrefixCannotBeSquatted) {
    TL_NEEDS_ROOT();
    Sidecar sc(SidecarOptions{.extra_security =
                                  kAllowAll + "\nreserved_names = [{ prefix = \"kv.\", uids = "
                                              "[65534] }, { prefix = \"grp.\", gids = [4242] }]"});
    ASSERT_TRUE(sc.ready()) << sc.log();
    const auto exposeAs = [&](uid_t uid, std::vector<gid_t> groups, const std::string &name) {
        Pipe out;
        pid_t p = forkClient([&]() -> int {
            if (!becomeUser(uid, uid, groups)) {
                out.send("50 cannot become the uid");
                return 50;
            }
            tl_client *c = nullptr;
            void *mem = nullptr;
            tl_region r = 0;
            if (tl_connect(sc.socket().c_str(), &c) != TL_OK ||
                tl_alloc_host(c, kSlot, &mem, &r) != TL_OK) {
                out.send("51 setup");
                return 51;
            }
            tl_status s = tl_expose(c, r, name.c_str());
            out.send(std::to_string(s) + " " + tl_last_error());
            // Held until the parent has looked: the name goes with the client.
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
            tl_disconnect(c);
            return 0;
        });
        std::string s = out.receive();
        waitChild(p);
        return s;
    };
    // uid B first: the squat is refused, naming the prefix and the key.
    std::string s = exposeAs(kUidB, {}, "kv.layer0");
    EXPECT_EQ(s.substr(0, s.find(' ')), std::to_string(TL_EPERM)) << s;
    EXPECT_TRUE(contains(s, "'kv.'")) << s;
    EXPECT_TRUE(contains(s, "reserved_names")) << s;
    // The uid it is reserved for, a member of the reserved group, and root may.
    s = exposeAs(kUidA, {}, "kv.layer0");
    EXPECT_EQ(s.substr(0, s.find(' ')), std::to_string(TL_OK)) << s;
    s = exposeAs(kUidC, {kGroup}, "grp.x");
    EXPECT_EQ(s.substr(0, s.find(' ')), std::to_string(TL_OK)) << s;
    s = exposeAs(kUidC, {}, "grp.x");
    EXPECT_EQ(s.substr(0, s.find(' ')), std::to_string(TL_EPERM)) << s;
    Inbox in = makeInbox(sc.socket(), 1);
    EXPECT_TRUE(in.region.expose("kv.root").ok());
    // Names outside every reserved prefix are anyone's.
    s = exposeAs(kUidB, {}, "kvx.layer0");
    EXPECT_EQ(s.substr(0, s.find(' ')), std::to_string(TL_OK)) << s;
}

TEST(Access, PeersWriteOnlyWhatIsOfferedAndNotificationsSayWho) {
    TempDir dir;
    const std::string key = dir.file("peer.key");
    writeFile(key, keyText('7'), 0600);
    const uint16_t pa = freePort();
    const uint16_t pb = freePort();
    const std::string tcp = "keepalive_ms = 200\npeer_timeout_ms = 1500\n";
    Sidecar a(SidecarOptions{.name = "node-a",
                             .listen = "127.0.0.1:" + std::to_string(pa),
                             .peers = {{"node-b", "127.0.0.1:" + std::to_string(pb)}},
                             .key_file = key,
                             .tcp = tcp});
    Sidecar b(SidecarOptions{.name = "node-b",
                             .listen = "127.0.0.1:" + std::to_string(pb),
                             .peers = {{"node-a", "127.0.0.1:" + std::to_string(pa)}},
                             .key_file = key,
                             .tcp = tcp});
    ASSERT_TRUE(a.ready()) << a.log();
    ASSERT_TRUE(b.ready()) << b.log();
    Inbox in = makeInbox(b.socket(), 2);
    // Not offered to peers (exposed first, so its descriptor would reach node-a first).
    auto local_only = in.client.allocHost(kSlot);
    ASSERT_TRUE(local_only.ok());
    ASSERT_TRUE(local_only->expose("acc.local", tensorlane::Access{.peers = false}).ok());
    ASSERT_TRUE(in.region.expose("acc.peer").ok());

    auto w = tensorlane::Client::connect(a.socket());
    ASSERT_TRUE(w.ok());
    auto src = w->allocHost(kSlot);
    ASSERT_TRUE(src.ok());
    fillRandom(src->data(), kSlot, 51);
    tl_remote dst = 0;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    tl_status ls = TL_ENOENT;
    while (std::chrono::steady_clock::now() < end) {
        ls = tl_lookup(w->get(), "node-b", "acc.peer", &dst, nullptr);
        if (ls == TL_OK || (ls != TL_ENOENT && ls != TL_EPEER)) {
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_EQ(ls, TL_OK) << tl_last_error() << a.log();
    tl_remote hidden = 0;
    EXPECT_EQ(tl_lookup(w->get(), "node-b", "acc.local", &hidden, nullptr), TL_ENOENT);
    tl_ticket t = 0;
    ASSERT_EQ(tl_write(w->get(), src->id(), 0, dst, 0, kSlot, 51, &t), TL_OK);
    EXPECT_EQ(tl_wait(w->get(), t, 10000), TL_OK) << tl_last_error();
    auto n = in.client.waitNotificationEx(std::chrono::seconds(10));
    ASSERT_TRUE(n.ok()) << n.error().detail;
    EXPECT_EQ(n->writer_uid, TL_UID_PEER);
    EXPECT_STREQ(n->n.peer, "node-a");
    EXPECT_EQ(n->n.imm, 51u);
    EXPECT_TRUE(samePattern(in.region.data(), kSlot, 51));
    // A local write into the same region says its writer's uid (root here).
    {
        auto lc = tensorlane::Client::connect(b.socket());
        ASSERT_TRUE(lc.ok());
        auto lsrc = lc->allocHost(kSlot);
        ASSERT_TRUE(lsrc.ok());
        auto ldst = lc->lookup("node-b", "acc.peer");
        ASSERT_TRUE(ldst.ok());
        auto lt = lc->write(*lsrc, 0, *ldst, kSlot, kSlot, 52);
        ASSERT_TRUE(lt.ok());
        EXPECT_EQ(lt->wait(std::chrono::seconds(10)), TL_OK);
        auto ln = in.client.waitNotificationEx(std::chrono::seconds(10));
        ASSERT_TRUE(ln.ok());
        EXPECT_EQ(ln->writer_uid, ::geteuid());
        EXPECT_EQ(ln->n.imm, 52u);
    }
}
