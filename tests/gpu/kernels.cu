// Kernels of the GPU tests and benchmarks, compiled to PTX at build time (nvcc -ptx) and loaded
// with the driver API (cuModuleLoad), so no test links the CUDA runtime.
//
// Data is 32-bit words derived from (seed, index), never zero: a receiver checks what it got
// on its own GPU by computing the same words.

__device__ __forceinline__ unsigned int tl_word(unsigned int seed, unsigned long long i) {
    unsigned long long x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (seed * 0xBF58476D1CE4E5B9ull);
    x ^= x >> 31;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 29;
    return static_cast<unsigned int>(x) | 1u;
}

__device__ __forceinline__ unsigned long long tl_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/// p[i] = word(seed, i).
extern "C" __global__ void tl_fill(unsigned int *p, unsigned long long n, unsigned int seed) {
    for (unsigned long long i = blockIdx.x * 1ull * blockDim.x + threadIdx.x; i < n;
         i += 1ull * gridDim.x * blockDim.x) {
        p[i] = tl_word(seed, i);
    }
}

/// As tl_fill, after every thread has spun for `spin_ns`: work that is still running when the
/// host returns from queueing it, so a write queued behind it that does not wait reads stale
/// data.
extern "C" __global__ void tl_spin_fill(unsigned int *p, unsigned long long n, unsigned int seed,
                                        unsigned long long spin_ns) {
    const unsigned long long start = tl_now();
    while (tl_now() - start < spin_ns) {
    }
    for (unsigned long long i = blockIdx.x * 1ull * blockDim.x + threadIdx.x; i < n;
         i += 1ull * gridDim.x * blockDim.x) {
        p[i] = tl_word(seed, i);
    }
}

/// *bad += the words of p that are not word(seed, i).
extern "C" __global__ void tl_check(const unsigned int *p, unsigned long long n, unsigned int seed,
                                    unsigned long long *bad) {
    unsigned long long mine = 0;
    for (unsigned long long i = blockIdx.x * 1ull * blockDim.x + threadIdx.x; i < n;
         i += 1ull * gridDim.x * blockDim.x) {
        mine += p[i] != tl_word(seed, i);
    }
    if (mine != 0) {
        atomicAdd(bad, mine);
    }
}

/// p[i] += v: the tiny kernel of the stream round trip.
extern "C" __global__ void tl_add(unsigned int *p, unsigned long long n, unsigned int v) {
    for (unsigned long long i = blockIdx.x * 1ull * blockDim.x + threadIdx.x; i < n;
         i += 1ull * gridDim.x * blockDim.x) {
        p[i] += v;
    }
}

/// Spins (one thread) until *flag != 0, or sets *timed_out after `timeout_ns`: a kernel that
/// waits for the host, as NCCL's kernels wait for their proxy thread.
extern "C" __global__ void tl_wait_flag(const volatile unsigned int *flag,
                                        unsigned long long timeout_ns, unsigned int *timed_out) {
    const unsigned long long start = tl_now();
    while (*flag == 0) {
        if (tl_now() - start > timeout_ns) {
            *timed_out = 1;
            return;
        }
    }
}
