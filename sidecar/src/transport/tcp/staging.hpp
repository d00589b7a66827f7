// GPU regions over tcp: chunks are staged through page-locked slots of one chunk each. The
// sender copies chunk k+1 device-to-host while chunk k is on the socket; the receiver reads a
// chunk into a slot (authenticating it as it lands) while the chunk before is copied
// host-to-device, and a write is complete only once every chunk is in device memory.
//
// TcpStaging is one pool of slots and its CudaStager thread, used on the engine thread by the
// links (OutLink for sending, InLink for receiving; each direction has a pool of its own, so
// slots held by sends waiting for a slow peer never starve the receiving side). A copy's result
// goes back to the link that asked (a StagingClient); a link that goes away forgets its copies,
// whose slots come back when the copies end.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda/stager.hpp"
#include "tensorlane/sidecar/status.hpp"

namespace tensorlane::sidecar {

class CudaImport;

/// Gets the results of the copies it asked for.
class StagingClient {
public:
    virtual ~StagingClient() = default;
    /// The copy `cookie` into or out of `slot` ended with `st`. The slot is the client's again.
    virtual void staged(uint64_t cookie, int slot, const Status &st) = 0;
};

class TcpStaging {
public:
    /// `slots` of `slot_bytes` each (one chunk), allocated on first use.
    TcpStaging(uint32_t slot_bytes, uint32_t slots);
    ~TcpStaging();
    TcpStaging(const TcpStaging &) = delete;
    TcpStaging &operator=(const TcpStaging &) = delete;

    /// Starts the pool on first use (a mapping and a thread; no CUDA call on this thread). kOk,
    /// or why there is no GPU staging (no CUDA in this sidecar). The error is kept.
    Status ensureStarted();
    /// The stager's eventfd once started (-1 before).
    int wakeFd() const;
    uint32_t slotBytes() const { return slot_bytes_; }

    /// A free slot, or -1 when all are taken (or the pool cannot start).
    int take();
    /// Gives a slot back.
    void give(int slot);
    unsigned char *data(int slot) const;

    /// Queues a copy between `slot` and device memory at `device_offset` of `import`'s
    /// allocation; `owner` hears of it in dispatch(). It goes to the stager at flush().
    void copy(StagingClient *owner, uint64_t cookie, int slot,
              const std::shared_ptr<CudaImport> &import, uint64_t device_offset, uint32_t bytes,
              bool to_device);
    /// One range of a slot and of device memory (copyPieces()).
    struct Piece {
        uint32_t slot_offset = 0;
        uint64_t device_offset = 0;
        uint32_t bytes = 0;
    };
    /// Queues copies between ranges of `slot` and device memory (a packed chunk's extents);
    /// `owner` hears of them once, when the last has ended (with the first error, if any).
    void copyPieces(StagingClient *owner, uint64_t cookie, int slot,
                    const std::shared_ptr<CudaImport> &import, const std::vector<Piece> &pieces,
                    bool to_device);
    /// Hands the copies queued since the last flush to the stager, together: they then run
    /// back to back on the GPU (one switch to the sidecar's context, not one per chunk) and cost
    /// one wake-up of the stager.
    void flush();
    /// Hands finished copies to their owners. Returns how many.
    size_t dispatch();
    /// Whether finished copies wait for dispatch().
    bool ready() const;
    /// `owner` goes away: its copies still running give their slots back when they end.
    void forget(StagingClient *owner);

private:
    struct Pending {
        StagingClient *owner = nullptr;
        uint64_t cookie = 0;
        int slot = -1;
    };

    const uint32_t slot_bytes_;
    const uint32_t slots_;
    std::unique_ptr<CudaStager> stager_;
    Status start_error_;
    bool started_ = false;
    std::vector<int> free_;
    std::unordered_map<uint64_t, Pending> pending_;  ///< by job id
    std::vector<CudaStager::Job> unsent_;            ///< queued by copy(), not yet flushed
    uint64_t next_job_ = 1;
};

/// Host buffers of one chunk each, for chunks of host regions on authenticated connections: such
/// a chunk is read into a buffer, and reaches its region only once its tag has verified (copied
/// by the tag worker that checked it, or by the engine thread), so a frame changed on the way
/// changes no byte of the target (docs/peers.md, "Integrity"). Buffers are made on first use and
/// kept for reuse (as many free as checks may run, and 8 more); one is lent per chunk being read or
/// checked. Engine thread only.
class HostStaging {
public:
    using Buffer = std::unique_ptr<uint8_t[]>;

    /// Buffers of `bytes` each; at most `max_checks` lent to tag workers at once (beyond, a
    /// chunk's tag is checked on the engine thread, which needs no further buffer).
    HostStaging(uint32_t bytes, size_t max_checks);
    HostStaging(const HostStaging &) = delete;
    HostStaging &operator=(const HostStaging &) = delete;

    uint32_t bufferBytes() const { return bytes_; }
    /// A buffer, or null when the memory cannot be had.
    Buffer take();
    void give(Buffer b);

    /// Whether one more chunk may go to the tag workers in its buffer (counted until
    /// endCheck()).
    bool startCheck();
    void endCheck();

    /// Buffers made and not freed (tests, status).
    size_t made() const { return made_; }
    /// Buffers lent out now.
    size_t lent() const { return lent_; }

private:
    const uint32_t bytes_;
    const size_t max_checks_;
    const size_t keep_;
    std::vector<Buffer> free_;
    size_t made_ = 0;
    size_t lent_ = 0;
    size_t checks_ = 0;
};

}  // namespace tensorlane::sidecar
