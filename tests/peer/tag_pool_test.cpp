// TagPool, frame tags on worker threads: a worker's tag is the tag the engine thread would have
// computed for the same frame number; a bad tag fails; a queued job taken back is never run,
// one finished now has its real answer. And a Connection that hands its chunk tags to the pool
// puts on the wire exactly what one that tags them itself does, never sends a tag before it is
// there, and lets go of the source only once no worker reads it.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "net/connection.hpp"
#include "net/cpus.hpp"
#include "net/tag_pool.hpp"
#include "socket_pair.hpp"

namespace tensorlane::sidecar {
namespace {

using Tag = std::array<uint8_t, FrameAuth::kTagBytes>;

FrameAuth::Key keyOf(uint8_t seed) {
    FrameAuth::Key k;
    for (size_t i = 0; i < k.size(); ++i) {
        k[i] = static_cast<uint8_t>(seed * 31 + i);
    }
    return k;
}

std::vector<uint8_t> randomBytes(size_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<uint8_t> v(n);
    for (auto &b : v) {
        b = static_cast<uint8_t>(rng());
    }
    return v;
}

std::shared_ptr<TagJob> jobFor(FrameAuth &auth, const uint8_t *head, const std::vector<uint8_t> &d,
                               bool verify) {
    auto job = std::make_shared<TagJob>();
    job->otk = auth.nextKey();
    std::memcpy(job->head.data(), head, kChunkFrameOverhead);
    job->head_len = static_cast<uint32_t>(kChunkFrameOverhead);
    job->data = d.data();
    job->len = d.size();
    job->verify = verify;
    return job;
}

void waitDone(const TagJob &job) {
    for (int i = 0; i < 20000 && !job.done.load(std::memory_order_acquire); ++i) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    ASSERT_TRUE(job.done.load(std::memory_order_acquire)) << "a tag job never ended";
}

TEST(TagPool, AutoGivesNoneOnSmallHostsAndAtMostFour) {
    EXPECT_EQ(TagPool::autoThreads(1), 0u);
    EXPECT_EQ(TagPool::autoThreads(2), 0u);
    EXPECT_EQ(TagPool::autoThreads(3), 0u);
    EXPECT_EQ(TagPool::autoThreads(4), 1u);
    EXPECT_EQ(TagPool::autoThreads(8), 2u);
    EXPECT_EQ(TagPool::autoThreads(16), 4u);
    EXPECT_EQ(TagPool::autoThreads(128), 4u);
    EXPECT_GE(usableCpus().cpus, 1u);
    TagPool none(0);
    EXPECT_EQ(none.threads(), 0u);
    EXPECT_EQ(none.wakeFd(), -1);
    EXPECT_FALSE(none.offloads(1u << 20)) << "a pool without workers took a frame";
    TagPool two(2);
    EXPECT_EQ(two.threads(), 2u);
    EXPECT_FALSE(two.offloads(TagPool::kOffloadFrom - 1));
    EXPECT_TRUE(two.offloads(TagPool::kOffloadFrom));
}

// The CPU budget behind [ipc] poll_mode and [tcp] tag_threads "auto": the affinity, lowered by
// a container's CPU quota (cgroup v2 cpu.max on the way up to the root, v1 cfs_quota_us).
TEST(CpuBudget, ACgroupQuotaLowersTheAffinityCount) {
    EXPECT_EQ(cpusOfQuota("200000 100000"), 2u);
    EXPECT_EQ(cpusOfQuota("150000 100000"), 2u);
    EXPECT_EQ(cpusOfQuota("50000 100000"), 1u);
    EXPECT_EQ(cpusOfQuota("max 100000"), std::nullopt);
    EXPECT_EQ(cpusOfQuota("garbage"), std::nullopt);
    EXPECT_EQ(cpusOfQuota("-1 100000"), std::nullopt);
    const CpuBudget plain = usableCpus("/nonexistent", "/nonexistent");
    EXPECT_GE(plain.cpus, 1u);
    EXPECT_EQ(plain.source, "affinity");

    namespace fs = std::filesystem;
    const fs::path root = fs::temp_directory_path() / ("tl-cpus-" + std::to_string(::getpid()));
    fs::remove_all(root);
    auto put = [&root](const std::string &rel, const std::string &text) {
        fs::create_directories((root / rel).parent_path());
        std::ofstream(root / rel) << text;
    };
    // v2: no quota on the leaf, one CPU on its parent: the parent binds.
    put("proc/self/cgroup", "0::/pods/worker\n");
    put("cg/pods/worker/cpu.max", "max 100000\n");
    put("cg/pods/cpu.max", "100000 100000\n");
    CpuBudget v2 = usableCpus((root / "proc").string(), (root / "cg").string());
    EXPECT_EQ(v2.cpus, 1u);
    EXPECT_NE(v2.source.find("pods/cpu.max 100000 100000"), std::string::npos) << v2.source;
    // v1: cpu,cpuacct with a quota of 1.5 CPUs: 2 (or the affinity, if that is 1).
    put("proc/self/cgroup", "12:memory:/x\n4:cpu,cpuacct:/x\n");
    put("cg/cpu,cpuacct/x/cpu.cfs_quota_us", "150000\n");
    put("cg/cpu,cpuacct/x/cpu.cfs_period_us", "100000\n");
    const CpuBudget v1 = usableCpus((root / "proc").string(), (root / "cg").string());
    EXPECT_EQ(v1.cpus, std::min(2u, plain.cpus));
    if (plain.cpus > 2) {
        EXPECT_NE(v1.source.find("cpu.cfs_quota_us 150000"), std::string::npos) << v1.source;
    }
    // A quota above the affinity changes nothing.
    put("cg/cpu,cpuacct/x/cpu.cfs_quota_us", "100000000\n");
    const CpuBudget wide = usableCpus((root / "proc").string(), (root / "cg").string());
    EXPECT_EQ(wide.cpus, plain.cpus);
    EXPECT_EQ(wide.source, "affinity");
    fs::remove_all(root);
}

TEST(TagPool, WorkersSignAndVerifyAsTheEngineThreadWould) {
    TagPool pool(3);
    ASSERT_EQ(pool.threads(), 3u);
    FrameAuth tx(keyOf(1));   // hands frames to the pool
    FrameAuth ref(keyOf(1));  // the same frames tagged here
    FrameAuth rx(keyOf(1));   // checks the pool's tags in the pool
    uint8_t head[kChunkFrameOverhead];
    std::vector<std::vector<uint8_t>> datas;
    std::vector<std::shared_ptr<TagJob>> signs;
    for (int i = 0; i < 24; ++i) {
        std::memset(head, i, sizeof head);
        datas.push_back(randomBytes(65536 + static_cast<size_t>(i) * 4099, 100 + i));
        signs.push_back(jobFor(tx, head, datas.back(), false));
        pool.submit(signs.back());
    }
    std::vector<std::shared_ptr<TagJob>> checks;
    for (int i = 0; i < 24; ++i) {
        waitDone(*signs[i]);
        std::memset(head, i, sizeof head);
        Tag expect;
        ref.sign(head, sizeof head, datas[i].data(), datas[i].size(), expect.data());
        EXPECT_EQ(signs[i]->tag, expect) << "frame " << i;
        EXPECT_FALSE(signs[i]->cancelled);
        auto check = jobFor(rx, head, datas[i], true);
        check->tag = signs[i]->tag;
        if (i % 5 == 3) {
            check->tag[i % 16] ^= 0x40;  // changed on the way
        }
        checks.push_back(check);
        pool.submit(check);
    }
    for (int i = 0; i < 24; ++i) {
        waitDone(*checks[i]);
        EXPECT_EQ(checks[i]->good, i % 5 != 3) << "frame " << i;
    }
    EXPECT_EQ(pool.jobsDone(), 48u);
    // The eventfd told the owner.
    uint64_t v = 0;
    EXPECT_EQ(::read(pool.wakeFd(), &v, sizeof v), static_cast<ssize_t>(sizeof v));
    EXPECT_GT(v, 0u);
}

// Workers that spin before they sleep (TENSORLANE_TAG_SPIN_US): jobs submitted while they spin
// go without a wake-up, jobs after a pause longer than the spin wake a sleeper, and none is lost
// either way (each submit below lands in one of the two states, or between them).
TEST(TagPool, SpinningWorkersMissNoJobWhetherAwakeOrAsleep) {
    TagPool pool(2, 200);
    FrameAuth tx(keyOf(9));
    FrameAuth ref(keyOf(9));
    uint8_t head[kChunkFrameOverhead] = {};
    for (int burst = 0; burst < 40; ++burst) {
        std::vector<std::vector<uint8_t>> datas;
        std::vector<std::shared_ptr<TagJob>> jobs;
        for (int i = 0; i < 3; ++i) {
            datas.push_back(randomBytes(4096 + static_cast<size_t>(burst * 3 + i), 900 + burst));
            jobs.push_back(jobFor(tx, head, datas.back(), false));
            pool.submit(jobs.back());
        }
        for (size_t i = 0; i < jobs.size(); ++i) {
            waitDone(*jobs[i]);
            Tag expect;
            ref.sign(head, sizeof head, datas[i].data(), datas[i].size(), expect.data());
            EXPECT_EQ(jobs[i]->tag, expect) << "burst " << burst << " job " << i;
        }
        // Pauses below, around and past the spin, so the next burst finds the workers spinning,
        // about to sleep, or asleep.
        std::this_thread::sleep_for(std::chrono::microseconds(burst % 4 * 150));
    }
    EXPECT_EQ(pool.jobsDone(), 120u);
}

TEST(TagPool, AVerifiedChunkIsCopiedToItsTargetAndABadOneNever) {
    // A host chunk is checked in its receive buffer and copied into its region by the worker,
    // only when its tag is good: a bad tag leaves every byte of the target as it was, on a
    // worker, with finishNow() on this thread, and when taken back.
    TagPool pool(2);
    FrameAuth tx(keyOf(9)), rx(keyOf(9));
    uint8_t head[kChunkFrameOverhead];
    std::memset(head, 7, sizeof head);
    constexpr int kJobs = 12;
    std::vector<std::vector<uint8_t>> datas, targets;
    std::vector<std::shared_ptr<TagJob>> checks;
    for (int i = 0; i < kJobs; ++i) {
        datas.push_back(randomBytes(256u << 10, 200 + i));
        Tag tag;
        tx.sign(head, sizeof head, datas.back().data(), datas.back().size(), tag.data());
        targets.push_back(std::vector<uint8_t>(datas.back().size(), 0xee));
        auto check = jobFor(rx, head, datas.back(), true);
        check->tag = tag;
        if (i % 3 == 1) {
            check->tag[5] ^= 0x01;  // changed on the way
        }
        check->copy_to = targets.back().data();
        checks.push_back(check);
        pool.submit(check);
    }
    pool.finishNow(*checks[kJobs - 1]);  // perhaps computed here
    pool.finishNow(*checks[kJobs - 2]);  // a bad one, perhaps here
    for (int i = 0; i < kJobs; ++i) {
        waitDone(*checks[i]);
        const bool good = i % 3 != 1;
        EXPECT_EQ(checks[i]->good, good) << "frame " << i;
        if (good) {
            EXPECT_EQ(targets[i], datas[i]) << "frame " << i << " verified but not copied";
        } else {
            EXPECT_EQ(targets[i], std::vector<uint8_t>(datas[i].size(), 0xee))
                << "frame " << i << " failed its tag and still changed its target";
        }
    }
}

TEST(TagPool, TheNextFrameNumberIsTheNextKey) {
    // A frame whose key was taken for the pool still uses up its number: frames after it,
    // tagged here, are numbered as on the wire.
    FrameAuth a(keyOf(2)), b(keyOf(2));
    const auto d = randomBytes(100, 3);
    uint8_t head[kChunkFrameOverhead] = {};
    (void)a.nextKey();
    b.begin();
    Tag ta, tb;
    a.sign(head, sizeof head, d.data(), d.size(), ta.data());
    b.sign(head, sizeof head, d.data(), d.size(), tb.data());
    EXPECT_EQ(ta, tb);
    EXPECT_EQ(a.frames(), 2u);
}

TEST(TagPool, QueuedJobsAreTakenBackOrFinishedNow) {
    TagPool pool(1);
    FrameAuth tx(keyOf(4)), ref(keyOf(4));
    uint8_t head[kChunkFrameOverhead] = {};
    // Enough big jobs that the last ones are still queued when we reach them.
    std::vector<std::vector<uint8_t>> datas;
    std::vector<std::shared_ptr<TagJob>> jobs;
    for (int i = 0; i < 16; ++i) {
        datas.push_back(randomBytes(4u << 20, 50 + i));
        jobs.push_back(jobFor(tx, head, datas.back(), false));
    }
    for (int i = 0; i < 16; ++i) {
        pool.submit(jobs[i]);
    }
    pool.cancelOrWait(*jobs[15]);
    EXPECT_TRUE(jobs[15]->done.load());
    pool.finishNow(*jobs[14]);
    ASSERT_TRUE(jobs[14]->done.load());
    for (int i = 0; i < 15; ++i) {
        pool.finishNow(*jobs[i]);
        Tag expect;
        ref.sign(head, sizeof head, datas[i].data(), datas[i].size(), expect.data());
        EXPECT_EQ(jobs[i]->tag, expect) << "frame " << i << " finished with a wrong tag";
        EXPECT_FALSE(jobs[i]->cancelled);
    }
    // The last was taken back before any worker reached it (one worker, 60 MiB ahead of it), so
    // its buffer may go; freeing it now must not be read after (ASan).
    EXPECT_TRUE(jobs[15]->cancelled);
    datas[15].clear();
    datas[15].shrink_to_fit();
}

TEST(TagPool, DestroyingThePoolEndsEveryJob) {
    FrameAuth tx(keyOf(5));
    uint8_t head[kChunkFrameOverhead] = {};
    std::vector<std::vector<uint8_t>> datas;
    std::vector<std::shared_ptr<TagJob>> jobs;
    {
        TagPool pool(1);
        for (int i = 0; i < 8; ++i) {
            datas.push_back(randomBytes(2u << 20, 70 + i));
            jobs.push_back(jobFor(tx, head, datas.back(), false));
            pool.submit(jobs.back());
        }
    }
    for (const auto &j : jobs) {
        EXPECT_TRUE(j->done.load()) << "a job was left neither run nor cancelled";
    }
}

/// What `queue` makes a connection put on the wire, read from the other end.
std::vector<uint8_t> wireOf(TagPool *pool, const std::vector<std::vector<uint8_t>> &chunks) {
    Poller poller;
    EXPECT_EQ(0, poller.open());
    SocketPair sp;
    std::vector<uint8_t> wire;
    {
        Connection c(poller, ipc::UniqueFd(sp.ours), "t", ConnRole::kOutData, 0, false);
        c.enableAuth(keyOf(9), keyOf(10));
        c.setTagPool(pool);
        for (size_t i = 0; i < chunks.size(); ++i) {
            uint8_t head[kChunkFrameOverhead];
            ChunkHeader h;
            h.region = 7;
            h.total_bytes = chunks[i].size();
            encodeChunkFrame(head, i + 1, h, static_cast<uint32_t>(chunks[i].size()));
            c.queueChunk(head, chunks[i].data(), static_cast<uint32_t>(chunks[i].size()), i + 1);
        }
        c.queueFrame(FrameType::kHeartbeat, 1);  // a small frame after them, tagged here
        std::vector<uint8_t> buf(1u << 20);
        for (int spins = 0; spins < 200000 && (c.hasOutput() || c.waitingForTag()); ++spins) {
            EXPECT_EQ(0, c.flush(0));
            if (c.waitingForTag()) {
                EXPECT_FALSE(c.hasOutput() && c.queuedBytes() == 0);
            }
            ssize_t n = ::recv(sp.theirs, buf.data(), buf.size(), MSG_DONTWAIT);
            if (n > 0) {
                wire.insert(wire.end(), buf.begin(), buf.begin() + n);
            }
        }
        EXPECT_FALSE(c.hasOutput());
    }
    for (;;) {
        std::vector<uint8_t> buf(1u << 20);
        ssize_t n = ::recv(sp.theirs, buf.data(), buf.size(), MSG_DONTWAIT);
        if (n <= 0) {
            break;
        }
        wire.insert(wire.end(), buf.begin(), buf.begin() + n);
    }
    return wire;
}

TEST(TagPool, AConnectionSendsTheSameBytesWithTheTagsOnWorkers) {
    std::vector<std::vector<uint8_t>> chunks;
    for (size_t n : {size_t{4096}, size_t{65536}, size_t{1} << 20, size_t{300001}, size_t{100}}) {
        chunks.push_back(randomBytes(n, n));
    }
    TagPool pool(2);
    const auto here = wireOf(nullptr, chunks);
    const auto offloaded = wireOf(&pool, chunks);
    // The three chunks of 64 KiB and more are signed by the pool, then written to the socket by
    // it once each is the queue's head with its tag there (a send that finds the socket full
    // ends early and goes on in another job; a rest under 64 KiB is the connection's).
    EXPECT_GE(pool.bytesSent(), 65536 + (1u << 20) + 300001 - 3 * TagPool::kWriteFrom);
    EXPECT_GE(pool.jobsDone(), 6u);
    ASSERT_EQ(here.size(), offloaded.size());
    EXPECT_TRUE(here == offloaded) << "the bytes from the pool differ from those made here";
}

TEST(TagPool, AChunkQueuedFirstIsSignedAndSentByOneWorker) {
    // A big chunk queued on an idle connection: the worker that signs it writes it too (one
    // job), and the frames behind it follow in order.
    std::vector<std::vector<uint8_t>> chunks;
    for (size_t n : {(size_t{1} << 20) + 5, size_t{4096}, size_t{300001}, size_t{70000}}) {
        chunks.push_back(randomBytes(n, n + 1));
    }
    TagPool pool(3);
    const auto here = wireOf(nullptr, chunks);
    const auto offloaded = wireOf(&pool, chunks);
    EXPECT_GE(pool.bytesSent(), (1u << 20) + 5 + 300001 + 70000 - 3 * TagPool::kWriteFrom);
    ASSERT_EQ(here.size(), offloaded.size());
    EXPECT_TRUE(here == offloaded) << "the bytes from the pool differ from those made here";
}

TEST(TagPool, DroppingOutputWaitsForTheWorkersReadingIt) {
    // The source is unmapped right after dropOutput() (as a session's failed writes let their
    // regions go): a worker still reading it would fault. (Poly1305 runs in OpenSSL's and
    // libsodium's uninstrumented code, where ASan would not see a read of freed memory.)
    TagPool pool(1);
    Poller poller;
    ASSERT_EQ(0, poller.open());
    constexpr size_t kLen = 4u << 20;
    for (int round = 0; round < 8; ++round) {
        int fds[2];
        ASSERT_EQ(0, ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds));
        Connection c(poller, ipc::UniqueFd(fds[0]), "t", ConnRole::kOutData, 0, false);
        c.enableAuth(keyOf(11), keyOf(12));
        c.setTagPool(&pool);
        std::vector<void *> sources;
        for (int i = 0; i < 6; ++i) {
            void *p =
                ::mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            ASSERT_NE(p, MAP_FAILED);
            std::memset(p, i, kLen);
            sources.push_back(p);
            uint8_t head[kChunkFrameOverhead] = {};
            c.queueChunk(head, static_cast<uint8_t *>(p), kLen, static_cast<uint64_t>(i + 1));
        }
        c.dropOutput();
        EXPECT_FALSE(c.hasOutput());
        EXPECT_FALSE(c.waitingForTag());
        for (void *p : sources) {
            ::munmap(p, kLen);
        }
        ::close(fds[1]);
    }
    // The pool is still sound: a new job runs.
    FrameAuth tx(keyOf(13));
    const auto d = randomBytes(1u << 20, 14);
    uint8_t head[kChunkFrameOverhead] = {};
    auto job = jobFor(tx, head, d, false);
    pool.submit(job);
    waitDone(*job);
    EXPECT_FALSE(job->cancelled);
}

}  // namespace
}  // namespace tensorlane::sidecar
