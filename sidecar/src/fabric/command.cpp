// runCommand: reads the NIC's QoS and pause counters through the operator's own tools
// (mlnx_qos, dcb, ethtool), which know driver details that sysfs does not show.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "fabric/internal.hpp"

extern char **environ;

namespace tensorlane::sidecar {

namespace {

constexpr size_t kMaxOutputBytes = 1 << 20;

}  // namespace

CommandOutput runCommand(const std::vector<std::string> &argv, int timeout_ms) {
    CommandOutput result;
    if (argv.empty()) {
        return result;
    }
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
        result.found = true;
        return result;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);

    std::vector<char *> args;
    for (const std::string &a : argv) {
        args.push_back(const_cast<char *>(a.c_str()));
    }
    args.push_back(nullptr);
    // The parsers read English output: pin the locale, keep the rest of the environment.
    std::vector<std::string> env_store;
    for (char **e = environ; *e != nullptr; ++e) {
        if (std::strncmp(*e, "LC_ALL=", 7) != 0 && std::strncmp(*e, "LANG=", 5) != 0) {
            env_store.emplace_back(*e);
        }
    }
    env_store.emplace_back("LC_ALL=C");
    std::vector<char *> envp;
    for (std::string &e : env_store) {
        envp.push_back(e.data());
    }
    envp.push_back(nullptr);

    pid_t pid = -1;
    const int rc = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    ::close(pipe_fds[1]);
    if (rc != 0) {
        ::close(pipe_fds[0]);
        result.found = rc != ENOENT;
        return result;
    }
    result.found = true;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    bool timed_out = false;
    char buf[4096];
    for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                              deadline - std::chrono::steady_clock::now())
                              .count();
        if (left <= 0) {
            timed_out = true;
            break;
        }
        pollfd p{pipe_fds[0], POLLIN, 0};
        const int n = ::poll(&p, 1, static_cast<int>(left));
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            timed_out = n == 0;
            break;
        }
        const ssize_t r = ::read(pipe_fds[0], buf, sizeof buf);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r <= 0) {
            break;
        }
        if (result.out.size() < kMaxOutputBytes) {
            result.out.append(buf, static_cast<size_t>(r));
        }
    }
    ::close(pipe_fds[0]);
    if (timed_out) {
        ::kill(pid, SIGKILL);
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    result.exit_code = !timed_out && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return result;
}

}  // namespace tensorlane::sidecar
