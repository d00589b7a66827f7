// The sidecar's CUDA runtime: the driver, the devices (known by UUID, since a client's
// ordinals depend on its CUDA_VISIBLE_DEVICES), one retained primary context per device, the
// cache of CUDA IPC imports (one mapping per allocation, shared by every region in it) and a
// release thread for the calls that may take milliseconds.
//
// Toolkit-free interface: device pointers are uint64_t, contexts void *. In a build without the
// CUDA toolkit every call reports kCuda ("built without CUDA").
//
// Threads: available(), ordinalOf() and the counters are cheap and safe anywhere (the engine
// thread uses them at registration). context(), openIpc() and pinHost() may take milliseconds
// (the first primary context: hundreds) and are called by transport threads only (the local
// copy thread, the tcp stager), never by the engine thread.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda/vmm_piece.hpp"
#include "tensorlane/sidecar/status.hpp"

namespace tensorlane::sidecar {

using CudaUuid = std::array<unsigned char, 16>;
using CudaIpcHandle = std::array<unsigned char, 64>;

class CudaIpcMapping;

class CudaRuntime {
public:
    /// The process's runtime, initialised on first use (dlopen, cuInit, the device list). Never
    /// destroyed: its release thread and contexts live as long as the process.
    static CudaRuntime &get();

    bool available() const { return available_; }
    /// Why not available (no driver, no device, built without the toolkit).
    const std::string &why() const { return why_; }
    int deviceCount() const { return static_cast<int>(devices_.size()); }
    /// This process's ordinal of the device with `uuid`; -1 when it does not see it.
    int ordinalOf(const CudaUuid &uuid) const;
    /// "NVIDIA H200 (0)" for logs.
    std::string deviceName(int ordinal) const;
    /// "CUDA_ERROR_NOT_SUPPORTED (operation not supported)" for a CUresult a client reported.
    static std::string errorText(int rc);

    /// The retained primary context (a CUcontext) of device `ordinal`, created on first use;
    /// peer access is enabled between it and every context retained before (NVLink or PCIe
    /// peer-to-peer, where cuDeviceCanAccessPeer allows).
    Status context(int ordinal, void **ctx);
    /// The import of an allocation exported with `handle` on device `ordinal`: opened on first
    /// use (cuIpcOpenMemHandle: 0.1 ms on the same GPU, 2 ms on another), shared while anyone
    /// holds it, closed on the release thread when the last holder lets go. An import is bound
    /// to the uid of the client that presented the handle first: while it is open, another uid
    /// presenting the same handle gets kPermission (a CUDA IPC handle is a capability; one uid
    /// must not reach another's memory through the sidecar's import).
    Status openIpc(const CudaIpcHandle &handle, int ordinal, uint32_t uid,
                   std::shared_ptr<CudaIpcMapping> *out);
    /// Maps a client's VMM pieces (their fds) back to back into a reservation of `span`
    /// bytes on device `ordinal` (at `hint`, the owner's address, where it is free), readable
    /// and writable from it: `*base` is the first byte,
    /// `*mapping` unmaps and frees the reservation when dropped (hand it to defer()). Each piece
    /// is mapped whole, so a piece whose real size is not what the client says fails here
    /// (kInvalid: the driver maps an allocation whole or not at all); an fd that is no CUDA
    /// allocation is kCuda. The fds may be closed afterwards: the mapping holds the memory.
    /// `host`: every piece must be pinned host memory (an allocation at a host location; any
    /// other is kInvalid before anything is mapped), and the span is made readable and writable
    /// by this process's CPU instead of the device: `*base` is then a CPU pointer.
    Status mapVmm(const std::vector<VmmPieceFd> &pieces, int ordinal, uint64_t span, uint64_t hint,
                  bool host, std::shared_ptr<void> *mapping, uint64_t *base);
    /// Page-locks [base, base + bytes) for DMA (cuMemHostRegister, portable); the memory must
    /// stay mapped until the returned handle is dropped (which unregisters it).
    Status pinHost(void *base, size_t bytes, std::shared_ptr<void> *out);
    /// Runs `fn` on the release thread; `fn` and whatever it captured are destroyed there too.
    void defer(std::function<void()> fn);

    /// IPC imports and VMM mappings open now (status, tests).
    uint64_t openMappings() const { return open_mappings_.load(std::memory_order_relaxed); }
    uint64_t importsOpened() const { return imports_opened_.load(std::memory_order_relaxed); }

private:
    friend class CudaIpcMapping;
    CudaRuntime();
    void closeIpc(CudaIpcMapping *m);
    void releaseLoop();

    struct Device {
        CudaUuid uuid{};
        std::string name;
        void *ctx = nullptr;  ///< retained primary context, once used
    };

    bool available_ = false;
    std::string why_;
    std::vector<Device> devices_;
    std::mutex ctx_mu_;  ///< contexts (retain, peer access)
    std::mutex ipc_mu_;  ///< the import table
    std::map<CudaIpcHandle, std::weak_ptr<CudaIpcMapping>> imports_;
    std::atomic<uint64_t> open_mappings_{0};
    std::atomic<uint64_t> imports_opened_{0};

    std::mutex rel_mu_;
    std::condition_variable rel_cv_;
    std::deque<std::function<void()>> rel_queue_;
    bool rel_started_ = false;
};

/// One open CUDA IPC import: the sidecar's device address of an allocation's first byte.
class CudaIpcMapping {
public:
    CudaIpcMapping(CudaIpcHandle handle, int ordinal, void *ctx, uint64_t base, uint64_t bytes,
                   uint32_t uid)
        : handle_(handle), ordinal_(ordinal), ctx_(ctx), base_(base), bytes_(bytes), uid_(uid) {}
    ~CudaIpcMapping();
    CudaIpcMapping(const CudaIpcMapping &) = delete;
    CudaIpcMapping &operator=(const CudaIpcMapping &) = delete;

    uint64_t base() const { return base_; }
    int ordinal() const { return ordinal_; }
    /// The allocation's size as the driver reports it for the sidecar's own mapping
    /// (cuMemGetAddressRange), never what a client claimed.
    uint64_t bytes() const { return bytes_; }
    /// The uid of the client whose export was imported first: another uid presenting the same
    /// handle is refused.
    uint32_t uid() const { return uid_; }

private:
    friend class CudaRuntime;
    CudaIpcHandle handle_;
    int ordinal_;
    void *ctx_;
    uint64_t base_;
    uint64_t bytes_;
    uint32_t uid_;
};

}  // namespace tensorlane::sidecar
