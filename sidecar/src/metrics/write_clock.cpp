#include "write_clock.hpp"

#include <cmath>
#include <fstream>
#include <string>
#include <thread>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace tensorlane::sidecar {
namespace {

#if defined(__x86_64__)
/// One (TSC, steady clock) pair: the steady reading bracketed by two TSC readings, from the
/// tightest bracket of a few tries (a try the scheduler interrupted has a wide one).
struct Pair {
    uint64_t tsc = 0;
    int64_t ns = 0;
    uint64_t bracket = UINT64_MAX;
};

Pair samplePair() {
    Pair best;
    for (int i = 0; i < 16; ++i) {
        const uint64_t before = readTsc();
        const int64_t ns = monotonicNs();
        const uint64_t after = readTsc();
        if (after >= before && after - before < best.bracket) {
            best = {before + (after - before) / 2, ns, after - before};
        }
    }
    return best;
}
#endif

}  // namespace

bool WriteClock::tscUsable() {
#if defined(__x86_64__)
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid(0x80000007, &eax, &ebx, &ecx, &edx) == 0 || (edx & (1u << 8)) == 0) {
        return false;
    }
    std::ifstream f("/sys/devices/system/clocksource/clocksource0/current_clocksource");
    std::string source;
    if (f >> source) {
        return source == "tsc";
    }
    return true;
#else
    return false;
#endif
}

WriteClock WriteClock::calibrated(std::chrono::microseconds calibration) {
    WriteClock c;
#if defined(__x86_64__)
    if (!tscUsable()) {
        return c;
    }
    const Pair a = samplePair();
    std::this_thread::sleep_for(calibration);
    const Pair b = samplePair();
    if (a.bracket == UINT64_MAX || b.bracket == UINT64_MAX || b.tsc <= a.tsc || b.ns <= a.ns) {
        return c;
    }
    const double ticks_per_ns =
        static_cast<double>(b.tsc - a.tsc) / static_cast<double>(b.ns - a.ns);
    // 200 MHz to 20 GHz: anything else is not a TSC rate (a trapped or emulated counter).
    if (!(ticks_per_ns > 0.2 && ticks_per_ns < 20.0)) {
        return c;
    }
    c.tsc0_ = a.tsc;
    c.ns0_ = a.ns;
    c.ticks_per_ns_ = ticks_per_ns;
    c.mult_ = static_cast<uint64_t>(std::llround(std::ldexp(1.0 / ticks_per_ns, kShift)));
#else
    (void)calibration;
#endif
    return c;
}

}  // namespace tensorlane::sidecar
