// TagPool, frame tags on worker threads: a worker's tag is the tag the engine thread would have
// computed for the same frame number; a bad tag fails; a queued job taken back is never run,
// one finished now has its real answer. And a Connection that hands its chunk tags to the pool
// puts on the wire exactly what one that tags them itself does, never sends a tag before it is
// there, and lets go of the source only once no worker reads it.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "net/connection.hpp"
#include "net/cpus.hpp"
#include "net/env_knob.hpp"
#include "net/tag_pool.hpp"
#include "socket_pair.hpp"

namespace tensorlane::sidecar {
namespace {

using Tag = std::array<uint8_t, FrameAuth::kTagBytes>;
/// A chunk frame's trailer: its tag, then its header tag.
using Trailer = std::array<uint8_t, kChunkTrailerBytes>;

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
    job->takeKeys(auth);
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
        Trailer expect;
        ref.signChunk(head, sizeof head, datas[i].data(), datas[i].size(), expect.data());
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
        EXPECT_TRUE(checks[i]->header_good) << "frame " << i << ": its headers did not change";
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
            Trailer expect;
            ref.signChunk(head, sizeof head, datas[i].data(), datas[i].size(), expect.data());
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
        Trailer tag;
        tx.signChunk(head, sizeof head, datas.back().data(), datas.back().size(), tag.data());
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

TEST(TagPool, TheHeaderTagTellsChangedDataFromAChangedHeader) {
    // A chunk frame's trailer holds its tag and a tag over its headers alone: a chunk whose
    // data changed on the way fails with its headers still good (its write fails, the stream
    // goes on), one whose headers changed fails both (the session goes), and neither lands. On
    // a worker and on this thread (finishNow of a queued job), and the same with FrameAuth.
    TagPool pool(1);
    FrameAuth tx(keyOf(13)), rx(keyOf(13)), here_tx(keyOf(14)), here_rx(keyOf(14));
    uint8_t head[kChunkFrameOverhead];
    std::memset(head, 0x21, sizeof head);
    enum Change { kNone, kData, kHeader, kHeaderTag };
    for (const Change change : {kNone, kData, kHeader, kHeaderTag}) {
        SCOPED_TRACE("change " + std::to_string(change));
        std::vector<uint8_t> data = randomBytes(96u << 10, 300 + change);
        Trailer trailer;
        tx.signChunk(head, sizeof head, data.data(), data.size(), trailer.data());
        uint8_t got_head[kChunkFrameOverhead];
        std::memcpy(got_head, head, sizeof head);
        if (change == kData) {
            data[4321] ^= 0x08;
        } else if (change == kHeader) {
            got_head[30] ^= 0x01;  // e.g. the write offset
        } else if (change == kHeaderTag) {
            trailer[kFrameTagBytes + 3] ^= 0x01;
        }
        std::vector<uint8_t> target(data.size(), 0xee);
        auto check = jobFor(rx, got_head, data, true);
        check->tag = trailer;
        check->copy_to = target.data();
        pool.submit(check);
        waitDone(*check);
        EXPECT_EQ(check->good, change == kNone || change == kHeaderTag);
        EXPECT_EQ(check->header_good, change != kHeader);
        if (!check->good) {
            EXPECT_EQ(target, std::vector<uint8_t>(data.size(), 0xee)) << "a failed chunk landed";
        }

        // The engine thread's way: FrameAuth, the header tag checked only after a failure.
        Trailer t2;
        std::vector<uint8_t> clean = randomBytes(5000, 400 + change);
        here_tx.signChunk(head, sizeof head, clean.data(), clean.size(), t2.data());
        if (change == kData) {
            clean[17] ^= 0x80;
        } else if (change == kHeaderTag) {
            t2[kFrameTagBytes] ^= 0x01;
        }
        const FrameMac::OneTimeKey head_key = here_rx.beginChunk(sizeof head + clean.size());
        here_rx.update(got_head, sizeof head);
        here_rx.update(clean.data(), clean.size());
        const bool good = here_rx.verify(t2.data());
        EXPECT_EQ(good, change == kNone || change == kHeaderTag);
        EXPECT_EQ(FrameAuth::headerTagMatches(head_key, got_head, sizeof head,
                                              t2.data() + kFrameTagBytes),
                  change != kHeader && change != kHeaderTag);
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
        Trailer expect;
        ref.signChunk(head, sizeof head, datas[i].data(), datas[i].size(), expect.data());
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

/// Writes all of `n` bytes to the non-blocking socket `fd`, waiting while it is full.
void sendAll(int fd, const uint8_t *p, size_t n) {
    while (n > 0) {
        const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= static_cast<size_t>(w);
        } else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
            std::this_thread::sleep_for(std::chrono::microseconds(50));
        } else {
            ADD_FAILURE() << "send: " << std::strerror(errno);
            return;
        }
    }
}

TEST(TagPool, AWorkerReadingAChunkTagsItAcrossRunsAndNeverReadsTheNextFrame) {
    // A big chunk read from its socket by a worker (TagJob::read_fd), its tag computed as the
    // bytes come: the data arrives in two parts with a pause longer than a run, so the first run
    // ends short and the next one (on either worker) goes on from the tag state the first left.
    // The socket is handed back (read_done) only once data and tag are in, the next frame's bytes
    // stay in it, and the chunk reaches its target only when its tag is good: a chunk changed in
    // its second part lands nothing.
    for (const bool corrupt : {false, true}) {
        SCOPED_TRACE(corrupt ? "changed on the way" : "intact");
        TagPool pool(2);
        FrameAuth tx(keyOf(12)), rx(keyOf(12));
        SocketPair sp;
        uint8_t head[kChunkFrameOverhead];
        std::memset(head, 0x5a, sizeof head);
        constexpr size_t kLen = 512u << 10, kFirst = 100u << 10;
        const std::vector<uint8_t> data = randomBytes(kLen, corrupt ? 81 : 80);
        Trailer tag;
        tx.signChunk(head, sizeof head, data.data(), data.size(), tag.data());
        std::vector<uint8_t> buf(kLen), target(kLen, 0xee);
        auto job = jobFor(rx, head, buf, true);
        job->read_fd = sp.ours;
        job->read_to = buf.data();
        job->copy_to = target.data();

        sendAll(sp.theirs, data.data(), kFirst);
        pool.submit(job);
        waitDone(*job);
        EXPECT_EQ(job->read_error, 0);
        EXPECT_EQ(job->have, kFirst);
        EXPECT_FALSE(job->readComplete());
        EXPECT_FALSE(job->read_done.load()) << "the socket was handed back before the chunk was in";
        EXPECT_FALSE(job->good);
        EXPECT_EQ(target, std::vector<uint8_t>(kLen, 0xee)) << "a chunk landed before its tag";

        std::vector<uint8_t> rest(data.begin() + kFirst, data.end());
        if (corrupt) {
            rest[1000] ^= 0x01;
        }
        const std::vector<uint8_t> next = randomBytes(64, 82);  // the next frame's first bytes
        std::thread sender([&] {
            sendAll(sp.theirs, rest.data(), rest.size());
            sendAll(sp.theirs, tag.data(), tag.size());
            sendAll(sp.theirs, next.data(), next.size());
        });
        for (int run = 0; run < 100 && job->read_error == 0 && !job->readComplete(); ++run) {
            job->done.store(false);
            pool.submit(job);
            waitDone(*job);
        }
        sender.join();
        EXPECT_EQ(job->read_error, 0);
        EXPECT_TRUE(job->readComplete());
        EXPECT_TRUE(job->read_done.load());
        EXPECT_EQ(job->good, !corrupt);
        if (corrupt) {
            EXPECT_EQ(target, std::vector<uint8_t>(kLen, 0xee)) << "a changed chunk landed";
        } else {
            EXPECT_EQ(target, data) << "a good chunk did not land whole";
        }
        std::vector<uint8_t> after(next.size() + 1);
        EXPECT_EQ(::recv(sp.ours, after.data(), after.size(), 0), static_cast<ssize_t>(next.size()))
            << "the worker read into the next frame";
        after.resize(next.size());
        EXPECT_EQ(after, next);
        ::close(sp.ours);
    }
}

TEST(TagPool, SocketJobsLeaveAWorkerForTagsAndAnEmptySocketIsHandedBack) {
    // Socket jobs take every worker but one (a pool of one: its one).
    for (const unsigned workers : {1u, 2u, 4u}) {
        TagPool pool(workers);
        const unsigned places = workers > 1 ? workers - 1 : 1;
        for (unsigned i = 0; i < places; ++i) {
            EXPECT_TRUE(pool.reserveSocket()) << workers << " workers, place " << i;
        }
        EXPECT_FALSE(pool.reserveSocket()) << workers << " workers: every one took a socket";
        pool.releaseSocket();
        EXPECT_TRUE(pool.reserveSocket());
    }
    // A worker in a read of a socket that has nothing for it hands the socket back (to the
    // engine's epoll) with nothing read and nothing counted, and runs a job queued meanwhile.
    // (How soon is a matter of microseconds, kSocketWaitUs at most: not asserted, since a
    // loaded machine delays wake-ups by milliseconds.)
    TagPool pool(1);
    FrameAuth tx(keyOf(21)), rx(keyOf(21));
    uint8_t head[kChunkFrameOverhead];
    std::memset(head, 0x3c, sizeof head);
    const std::vector<uint8_t> data = randomBytes(4096, 90);
    SocketPair sp;
    std::vector<uint8_t> buf(256u << 10);
    auto reading = jobFor(rx, head, buf, true);
    reading->read_fd = sp.ours;
    reading->read_to = buf.data();
    pool.submit(reading);
    auto sign = jobFor(tx, head, data, false);
    pool.submit(sign);
    waitDone(*sign);
    waitDone(*reading);
    EXPECT_TRUE(sign->tag_ready);
    EXPECT_EQ(reading->read_error, 0);
    EXPECT_EQ(reading->have, 0u);
    EXPECT_FALSE(reading->readComplete());
    EXPECT_FALSE(reading->read_done.load()) << "an empty socket's chunk counted as read";
    EXPECT_FALSE(reading->good);
    ::close(sp.ours);
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

// The experiment knobs (TENSORLANE_TAG_SPIN_US and the others, docs/peers.md) take a whole
// decimal number or nothing: a typo leaves the default, never a half-read value.
TEST(EnvNumber, TakesAWholeDecimalNumberOrNothing) {
    constexpr const char *kName = "TENSORLANE_TEST_ENV_NUMBER";
    const std::pair<const char *, std::optional<uint64_t>> cases[] = {
        {"0", 0},
        {"65536", 65536},
        {"18446744073709551615", UINT64_MAX},
        {"", std::nullopt},
        {"12us", std::nullopt},
        {" 5", std::nullopt},
        {"-5", std::nullopt},
        {"+5", std::nullopt},
        {"0x10", std::nullopt}};
    for (const auto &[text, want] : cases) {
        ::setenv(kName, text, 1);
        EXPECT_EQ(envNumber(kName), want) << "\"" << text << "\"";
    }
    ::unsetenv(kName);
    EXPECT_EQ(envNumber(kName), std::nullopt);
}

}  // namespace
}  // namespace tensorlane::sidecar
