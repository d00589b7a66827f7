// gpu_tests' main: GoogleTest, or one worker process (`--worker NAME ARGS...`, gpu_support.hpp).
#include <gtest/gtest.h>

#include <cstdio>

#include "gpu_support.hpp"

int main(int argc, char **argv) {
    if (argc >= 3 && std::string(argv[1]) == "--worker") {
        auto it = tlgpu::workers().find(argv[2]);
        if (it == tlgpu::workers().end()) {
            std::fprintf(stderr, "no worker %s\n", argv[2]);
            return 126;
        }
        return it->second(std::vector<std::string>(argv + 3, argv + argc));
    }
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}
