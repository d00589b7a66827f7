// Runs a libFuzzer target's LLVMFuzzerTestOneInput over files and directories of inputs, for
// builds without libFuzzer (gcc): the seed corpus becomes a CTest that any build runs.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

namespace {

int runFile(const std::filesystem::path &p) {
    std::ifstream in(p, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t *>(bytes.data()), bytes.size());
    return 1;
}

}  // namespace

int main(int argc, char **argv) {
    int runs = 0;
    for (int i = 1; i < argc; ++i) {
        const std::filesystem::path arg(argv[i]);
        if (std::filesystem::is_directory(arg)) {
            for (const auto &e : std::filesystem::directory_iterator(arg)) {
                if (e.is_regular_file()) {
                    runs += runFile(e.path());
                }
            }
        } else {
            runs += runFile(arg);
        }
    }
    std::printf("%d input(s) ran\n", runs);
    return runs > 0 ? 0 : 1;
}
