// Running the `tensorlane` binary from tests: its exit status and output.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace tltest {

struct CmdResult {
    int rc = -1;      ///< the exit status; -1 when it did not exit normally
    std::string out;  ///< stdout (and stderr unless left out)
};

/// Runs `cmd` with /bin/sh.
inline CmdResult runCmd(const std::string &cmd, bool with_stderr = true) {
    CmdResult r;
    FILE *p = ::popen((cmd + (with_stderr ? " 2>&1" : " 2>/dev/null")).c_str(), "r");
    if (p == nullptr) {
        return r;
    }
    char buf[4096];
    size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) {
        r.out.append(buf, n);
    }
    const int status = ::pclose(p);
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
}

}  // namespace tltest
