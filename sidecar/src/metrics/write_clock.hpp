// The clock the engine times writes with for the latency histograms: the CPU's time-stamp
// counter where it is a clock (x86-64 with an invariant TSC that the kernel itself trusts),
// converted to nanoseconds with a rate measured against the steady clock at start; the steady
// clock otherwise.
//
// Why not the steady clock always: clock_gettime through the vDSO costs 25-40 ns on the VMs
// measured here and orders itself after every earlier load (rdtsc_ordered: lfence or rdtscp),
// and a timed write reads a clock on the engine thread's request path. A plain rdtsc costs
// about 10 ns and waits for nothing (docs/benchmarks.md, issue 20).
#pragma once

#include <chrono>
#include <cstdint>

namespace tensorlane::sidecar {

/// The steady clock in nanoseconds (CLOCK_MONOTONIC through the vDSO: no syscall).
inline int64_t monotonicNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

/// RDTSC (GCC's and Clang's builtin: no intrinsics header in every engine file). Not ordered
/// against the instructions around it, on purpose: it may run some tens of cycles early,
/// nothing a histogram of microseconds can see. 0 on other architectures (never used there).
inline uint64_t readTsc() {
#if defined(__x86_64__)
    return __builtin_ia32_rdtsc();
#else
    return 0;
#endif
}

/// Nanoseconds on a steady timebase, for differences between two readings of the same clock
/// (one thread's acceptance and end of a write). Never 0 (0 means "not timed" to the engine).
class WriteClock {
public:
    /// The steady clock.
    WriteClock() = default;

    /// The TSC if it is usable here (tscUsable()), calibrated against the steady clock over
    /// `calibration` (a sleep; the start of a sidecar with the metrics endpoint on waits this
    /// long once); the steady clock otherwise, or when the measured rate is implausible.
    static WriteClock calibrated(
        std::chrono::microseconds calibration = std::chrono::milliseconds(5));

    /// Whether this machine's TSC can time writes: x86-64, CPUID.80000007H:EDX[8] (invariant
    /// TSC: a constant rate in every P-, C- and T-state, Intel SDM vol. 3B 18.17.1; AMD APM
    /// vol. 3, CPUID Fn8000_0007), and the kernel's clocksource is `tsc` (it checked that the
    /// CPUs' counters agree; under kvm-clock, hpet or xen it did not, or found they do not).
    /// Where the clocksource cannot be read (no /sys, a sandbox), CPUID decides.
    static bool tscUsable();

    /// Now, in nanoseconds (comparable only with this clock's other readings).
    int64_t nowNs() const {
        if (mult_ != 0) {
            // Signed: a reading a few ticks below tsc0_ (another CPU's counter, marginally
            // behind) stays a small negative offset, never a wrapped huge one.
            const auto ticks = static_cast<int64_t>(readTsc() - tsc0_);
            return ns0_ + static_cast<int64_t>((static_cast<__int128>(ticks) * mult_) >> kShift);
        }
        return monotonicNs();
    }

    /// Whether nowNs() reads the TSC.
    bool usesTsc() const { return mult_ != 0; }
    /// The TSC's measured rate in ticks per nanosecond (GHz); 0 for the steady clock.
    double ticksPerNs() const { return ticks_per_ns_; }
    /// "tsc" or "steady_clock", for the log and the docs.
    const char *name() const { return usesTsc() ? "tsc" : "steady_clock"; }

private:
    static constexpr int kShift = 32;  ///< nanoseconds = ticks * mult_ >> kShift

    uint64_t tsc0_ = 0;  ///< the TSC at calibration's start ...
    int64_t ns0_ = 0;    ///< ... and the steady clock then
    uint64_t mult_ = 0;  ///< 2^kShift / (ticks per ns); 0: the steady clock
    double ticks_per_ns_ = 0;
};

}  // namespace tensorlane::sidecar
