// The tcp frame tags' cost: FrameAuth::sign with OpenSSL's Poly1305 against libsodium's (the
// earlier implementation), same run, frame sizes from a control frame to a data chunk.
//   build/release/tests/peer/frame_auth_bench
#include <benchmark/benchmark.h>
#include <sodium.h>

#include <vector>

#include "net/frame_auth.hpp"

namespace {

using tensorlane::sidecar::FrameAuth;

void Sign(benchmark::State &state, FrameAuth::Backend backend) {
    if (sodium_init() < 0) {
        state.SkipWithError("sodium_init failed");
        return;
    }
    FrameAuth::Key key{};
    key[0] = 1;
    FrameAuth auth(key, backend);
    const size_t n = static_cast<size_t>(state.range(0));
    std::vector<uint8_t> head(24, 7), data(n, 9);
    uint8_t tag[FrameAuth::kTagBytes];
    for (auto _ : state) {
        auth.sign(head.data(), head.size(), data.data(), data.size(), tag);
        benchmark::DoNotOptimize(tag);
    }
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                            static_cast<int64_t>(n + head.size()));
}

}  // namespace

BENCHMARK_CAPTURE(Sign, openssl, FrameAuth::Backend::kOpenSsl)
    ->Arg(64)
    ->Arg(4096)
    ->Arg(262144)
    ->Arg(1 << 20);
BENCHMARK_CAPTURE(Sign, sodium, FrameAuth::Backend::kSodium)
    ->Arg(64)
    ->Arg(4096)
    ->Arg(262144)
    ->Arg(1 << 20);

BENCHMARK_MAIN();
