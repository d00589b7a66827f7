// TraceLines (tensorlane/ipc/trace_lines.hpp): the in-memory trace of the NCCL plugin and the
// sidecar. Lines keep their order and a wall-clock time; a line too long is cut, not overrun; and
// the file is never written through a name that already exists (a sidecar writes it as root).
#include "tensorlane/ipc/trace_lines.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace ipc = tensorlane::ipc;
namespace fs = std::filesystem;

namespace {

class Dir {
public:
    Dir() {
        char tmpl[] = "/tmp/tl-trace-XXXXXX";
        root_ = ::mkdtemp(tmpl);
    }
    ~Dir() {
        std::error_code ec;
        fs::remove_all(root_, ec);
    }
    std::string path(const std::string &name) const { return root_ + "/" + name; }

private:
    std::string root_;
};

std::vector<std::string> lines(const std::string &file) {
    std::ifstream in(file);
    std::vector<std::string> out;
    for (std::string l; std::getline(in, l);) {
        out.push_back(l);
    }
    return out;
}

TEST(TraceLines, LinesFromManyThreadsAreAllWrittenWithTheirWallClockTime) {
    Dir d;
    ipc::TraceLines t(d.path("t"));
    std::vector<std::thread> threads;
    for (int k = 0; k < 4; ++k) {
        threads.emplace_back([&t, k] {
            for (int i = 0; i < 1000; ++i) {
                t.addf("thread %d step %d", k, i);
            }
        });
    }
    for (auto &th : threads) {
        th.join();
    }
    ASSERT_TRUE(t.write("test"));
    const auto got = lines(d.path("t." + std::to_string(::getpid())));
    ASSERT_EQ(got.size(), 4000u);
    const double now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    std::vector<int> next(4, 0);
    for (const std::string &l : got) {
        double secs = 0;
        int k = -1, i = -1;
        ASSERT_EQ(std::sscanf(l.c_str(), "%lf thread %d step %d", &secs, &k, &i), 3) << l;
        EXPECT_LT(std::abs(now - secs), 60.0) << l;
        EXPECT_EQ(l.find('.'), l.find(' ') - 7) << "not six digits of microseconds: " << l;
        ASSERT_GE(k, 0);
        ASSERT_LT(k, 4);
        EXPECT_EQ(i, next[k]) << "a thread's lines out of order";
        next[k] = i + 1;
    }
}

TEST(TraceLines, ALongLineIsCutAndLinesPastTheLimitAreCounted) {
    Dir d;
    ipc::TraceLines t(d.path("t"));
    const std::string big(1000, 'x');
    t.addf("%s", big.c_str());
    ASSERT_TRUE(t.write("test"));
    const auto got = lines(d.path("t." + std::to_string(::getpid())));
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].size(), ipc::TraceLines::kBytes - 1);

    ipc::TraceLines full(d.path("full"));
    for (size_t i = 0; i < ipc::TraceLines::kLines + 3; ++i) {
        full.addf("%zu", i);
    }
    ASSERT_TRUE(full.write("test"));
    const auto all = lines(d.path("full." + std::to_string(::getpid())));
    ASSERT_EQ(all.size(), ipc::TraceLines::kLines + 1);
    EXPECT_EQ(all.back(), "# 3 more lines did not fit");
}

TEST(TraceLines, ANameThatIsAlreadyThereIsNeitherFollowedNorOverwritten) {
    Dir d;
    const std::string victim = d.path("victim");
    { std::ofstream(victim) << "keep me\n"; }
    ipc::TraceLines t(d.path("t"));
    t.addf("a step");
    const std::string file = d.path("t." + std::to_string(::getpid()));
    ASSERT_EQ(::symlink(victim.c_str(), file.c_str()), 0);
    EXPECT_FALSE(t.write("test"));
    EXPECT_EQ(lines(victim), std::vector<std::string>{"keep me"});
    ASSERT_EQ(::unlink(file.c_str()), 0);
    { std::ofstream(file) << "an earlier run\n"; }
    EXPECT_FALSE(t.write("test"));
    EXPECT_EQ(lines(file), std::vector<std::string>{"an earlier run"});
}

}  // namespace
