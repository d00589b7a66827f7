// The loader path that puts the simulated HCA's libibverbs.so.1 (`simhca_dir`) in front of the
// one this process runs with, which it keeps: a host whose dependencies live in a prefix on
// LD_LIBRARY_PATH (the GPU machine) still finds them. For programs a test starts on the
// simulator, the production sidecar among them.
#pragma once

#include <cstdlib>
#include <string>

namespace tltest {

inline std::string simhcaLoaderPath(const char *simhca_dir) {
    const char *was = std::getenv("LD_LIBRARY_PATH");
    std::string path = simhca_dir;
    if (was != nullptr && *was != '\0') {
        path += std::string(":") + was;
    }
    return path;
}

}  // namespace tltest
