// Support for the GPU tests and benchmarks: the CUDA driver opened at run time (as the shim and
// the sidecar open it), the test kernels (PTX from kernels.cu), and worker processes.
//
// Workers are this same binary run again with `--worker NAME ARGS...` (fork + exec): CUDA cannot
// be used in a child forked from a process that has initialised it, and the tests' own process
// uses CUDA to check results.
#pragma once

#include <dlfcn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#ifdef TENSORLANE_HAVE_CUDA
#include <cuda.h>
#endif

namespace tlgpu {

/// Workers by name; main() runs one when argv[1] is --worker.
using WorkerFn = int (*)(const std::vector<std::string> &args);
inline std::map<std::string, WorkerFn> &workers() {
    static std::map<std::string, WorkerFn> w;
    return w;
}
struct WorkerRegistration {
    WorkerRegistration(const char *name, WorkerFn fn) { workers()[name] = fn; }
};
#define TL_GPU_WORKER(name)                                                    \
    static int name(const std::vector<std::string> &args);                     \
    static const ::tlgpu::WorkerRegistration name##_registration(#name, name); \
    static int name(const std::vector<std::string> &args)

/// Runs `name` with `args` in a new process of this binary; its pid.
inline pid_t spawnWorker(const std::string &name, const std::vector<std::string> &args) {
    std::vector<std::string> argv = {"gpu-worker", "--worker", name};
    argv.insert(argv.end(), args.begin(), args.end());
    const pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid == 0) {
        // A worker never outlives its test or benchmark, whatever ends it.
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != parent) {
            ::_exit(1);
        }
        std::vector<char *> p;
        for (auto &a : argv) {
            p.push_back(a.data());
        }
        p.push_back(nullptr);
        ::execv("/proc/self/exe", p.data());
        ::_exit(127);
    }
    return pid;
}

/// Waits for a worker: its exit status, or 128 + signal.
inline int waitWorker(pid_t pid) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/// Polls `cond` every millisecond until it holds or `timeout` passes.
inline bool waitFor(const std::function<bool()> &cond,
                    std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
        if (cond()) {
            return true;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return cond();
}

#ifdef TENSORLANE_HAVE_CUDA

#define TL_TEST_CUDA_CALLS(X)        \
    X(cuInit)                        \
    X(cuGetErrorString)              \
    X(cuDeviceGet)                   \
    X(cuDeviceGetCount)              \
    X(cuDeviceGetUuid)               \
    X(cuIpcGetMemHandle)             \
    X(cuMemGetHandleForAddressRange) \
    X(cuDevicePrimaryCtxRetain)      \
    X(cuCtxSetCurrent)               \
    X(cuCtxSynchronize)              \
    X(cuMemAlloc)                    \
    X(cuMemFree)                     \
    X(cuMemAllocManaged)             \
    X(cuMemAllocHost)                \
    X(cuMemFreeHost)                 \
    X(cuMemGetInfo)                  \
    X(cuMemcpyHtoD)                  \
    X(cuMemcpyDtoH)                  \
    X(cuMemcpyAsync)                 \
    X(cuMemcpyDtoDAsync)             \
    X(cuMemcpyDtoHAsync)             \
    X(cuMemsetD32)                   \
    X(cuMemHostGetFlags)             \
    X(cuModuleLoad)                  \
    X(cuModuleGetFunction)           \
    X(cuLaunchKernel)                \
    X(cuStreamCreate)                \
    X(cuStreamDestroy)               \
    X(cuStreamSynchronize)           \
    X(cuStreamQuery)                 \
    X(cuStreamWriteValue32)          \
    X(cuStreamBeginCapture)          \
    X(cuStreamEndCapture)            \
    X(cuGraphInstantiate)            \
    X(cuGraphLaunch)                 \
    X(cuGraphExecDestroy)            \
    X(cuGraphDestroy)                \
    X(cuEventCreate)                 \
    X(cuEventRecord)                 \
    X(cuEventQuery)                  \
    X(cuEventSynchronize)            \
    X(cuEventElapsedTime)            \
    X(cuEventDestroy)                \
    X(cuMemCreate)                   \
    X(cuMemRelease)                  \
    X(cuMemAddressReserve)           \
    X(cuMemAddressFree)              \
    X(cuMemMap)                      \
    X(cuMemUnmap)                    \
    X(cuMemSetAccess)                \
    X(cuMemGetAllocationGranularity) \
    X(cuMemExportToShareableHandle)

#define TL_TEST_CUDA_SYMBOL_(x) #x
#define TL_TEST_CUDA_SYMBOL(x) TL_TEST_CUDA_SYMBOL_(x)

/// The driver for a test process: one device (0), its primary context current on the calling
/// thread, the test kernels loaded.
struct Cuda {
#define TL_TEST_CUDA_MEMBER(name) decltype(&::name) name = nullptr;
    TL_TEST_CUDA_CALLS(TL_TEST_CUDA_MEMBER)
#undef TL_TEST_CUDA_MEMBER
    CUcontext ctx = nullptr;
    CUmodule module = nullptr;
    CUfunction k_fill = nullptr, k_spin_fill = nullptr, k_check = nullptr, k_add = nullptr,
               k_wait_flag = nullptr;
    std::string why;  ///< why open() failed: the reason a test skips with

    /// False (with `why`) where there is no driver, no GPU or no kernels.
    bool open() {
        void *lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (lib == nullptr) {
            why = "no CUDA driver (libcuda.so.1) on this machine";
            return false;
        }
#define TL_TEST_CUDA_LOAD(name)                                                       \
    name = reinterpret_cast<decltype(name)>(::dlsym(lib, TL_TEST_CUDA_SYMBOL(name))); \
    if (name == nullptr) {                                                            \
        why = std::string("the CUDA driver lacks ") + TL_TEST_CUDA_SYMBOL(name);      \
        return false;                                                                 \
    }
        TL_TEST_CUDA_CALLS(TL_TEST_CUDA_LOAD)
#undef TL_TEST_CUDA_LOAD
        int n = 0;
        if (cuInit(0) != CUDA_SUCCESS || cuDeviceGetCount(&n) != CUDA_SUCCESS || n == 0) {
            why = "the CUDA driver reports no usable GPU";
            return false;
        }
        CUdevice dev = 0;
        if (!ok(cuDeviceGet(&dev, 0), "cuDeviceGet") ||
            !ok(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain") ||
            !ok(cuCtxSetCurrent(ctx), "cuCtxSetCurrent")) {
            return false;
        }
        const std::string ptx = TENSORLANE_GPU_KERNELS;
        if (ptx.empty()) {
            why = "built without nvcc: no test kernels";
            return false;
        }
        return ok(cuModuleLoad(&module, ptx.c_str()), "cuModuleLoad(" + ptx + ")") &&
               ok(cuModuleGetFunction(&k_fill, module, "tl_fill"), "tl_fill") &&
               ok(cuModuleGetFunction(&k_spin_fill, module, "tl_spin_fill"), "tl_spin_fill") &&
               ok(cuModuleGetFunction(&k_check, module, "tl_check"), "tl_check") &&
               ok(cuModuleGetFunction(&k_add, module, "tl_add"), "tl_add") &&
               ok(cuModuleGetFunction(&k_wait_flag, module, "tl_wait_flag"), "tl_wait_flag");
    }
    /// Makes the context current on another thread.
    void bind() const {
        cuCtxSetCurrent(ctx);
    }

    bool ok(CUresult rc, const std::string &what) {
        if (rc == CUDA_SUCCESS) {
            return true;
        }
        const char *text = nullptr;
        cuGetErrorString(rc, &text);
        why = what + ": " + (text ? text : "CUDA error " + std::to_string(rc));
        return false;
    }

    static unsigned gridFor(uint64_t words) {
        return static_cast<unsigned>(std::min<uint64_t>((words + 255) / 256, 1024));
    }
    /// Queues fill(seed) of `words` words at `p` on `s`.
    CUresult fill(CUdeviceptr p, uint64_t words, uint32_t seed, CUstream s = nullptr) {
        unsigned long long n = words;
        void *args[] = {&p, &n, &seed};
        return cuLaunchKernel(k_fill, gridFor(words), 1, 1, 256, 1, 1, 0, s, args, nullptr);
    }
    /// Queues a fill that starts only after `spin_ns` of spinning.
    CUresult spinFill(CUdeviceptr p, uint64_t words, uint32_t seed, uint64_t spin_ns, CUstream s) {
        unsigned long long n = words, ns = spin_ns;
        void *args[] = {&p, &n, &seed, &ns};
        return cuLaunchKernel(k_spin_fill, gridFor(words), 1, 1, 256, 1, 1, 0, s, args, nullptr);
    }
    /// Queues check(seed) into the device counter `bad`.
    CUresult check(CUdeviceptr p, uint64_t words, uint32_t seed, CUdeviceptr bad,
                   CUstream s = nullptr) {
        unsigned long long n = words;
        void *args[] = {&p, &n, &seed, &bad};
        return cuLaunchKernel(k_check, gridFor(words), 1, 1, 256, 1, 1, 0, s, args, nullptr);
    }
    CUresult add(CUdeviceptr p, uint64_t words, uint32_t v, CUstream s = nullptr) {
        unsigned long long n = words;
        void *args[] = {&p, &n, &v};
        return cuLaunchKernel(k_add, gridFor(words), 1, 1, 256, 1, 1, 0, s, args, nullptr);
    }
    /// Queues a kernel that spins until the host sets *flag (pinned host memory), or sets
    /// *timed_out after `timeout_ns`.
    CUresult waitFlag(const unsigned *flag, uint64_t timeout_ns, unsigned *timed_out, CUstream s) {
        const unsigned *f = flag;
        unsigned long long ns = timeout_ns;
        unsigned *t = timed_out;
        void *args[] = {&f, &ns, &t};
        return cuLaunchKernel(k_wait_flag, 1, 1, 1, 1, 1, 1, 0, s, args, nullptr);
    }
    /// The words at `p` that are not fill(seed)'s, counted on the GPU; UINT64_MAX on error.
    uint64_t mismatches(CUdeviceptr p, uint64_t words, uint32_t seed) {
        CUdeviceptr bad = 0;
        uint64_t host = UINT64_MAX;
        if (cuMemAlloc(&bad, 8) != CUDA_SUCCESS) {
            return host;
        }
        uint64_t zero = 0;
        if (cuMemcpyHtoD(bad, &zero, 8) == CUDA_SUCCESS &&
            check(p, words, seed, bad) == CUDA_SUCCESS && cuCtxSynchronize() == CUDA_SUCCESS) {
            cuMemcpyDtoH(&host, bad, 8);
        }
        cuMemFree(bad);
        return host;
    }
    /// Free device memory of device 0, all processes counted.
    uint64_t freeBytes() {
        size_t free_b = 0, total = 0;
        cuMemGetInfo(&free_b, &total);
        return free_b;
    }
};

/// Fills a host buffer with fill(seed)'s words.
inline void fillHost(void *p, uint64_t words, uint32_t seed) {
    auto *w = static_cast<uint32_t *>(p);
    for (uint64_t i = 0; i < words; ++i) {
        uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (seed * 0xBF58476D1CE4E5B9ull);
        x ^= x >> 31;
        x *= 0x94D049BB133111EBull;
        x ^= x >> 29;
        w[i] = static_cast<uint32_t>(x) | 1u;
    }
}
/// Words of a host buffer that are not fill(seed)'s.
inline uint64_t hostMismatches(const void *p, uint64_t words, uint32_t seed) {
    std::vector<uint32_t> want(words);
    fillHost(want.data(), words, seed);
    const auto *w = static_cast<const uint32_t *>(p);
    uint64_t bad = 0;
    for (uint64_t i = 0; i < words; ++i) {
        bad += w[i] != want[i];
    }
    return bad;
}

#endif  // TENSORLANE_HAVE_CUDA

}  // namespace tlgpu
