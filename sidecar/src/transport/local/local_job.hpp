// One local write as the local transport's three paths carry it (local_transport.hpp): the
// op, how far it got, and what the engine is told when it ends. The checks made when a write
// starts and the verdict when its bytes are in place are the same on every path, so they live
// here once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensorlane/sidecar/transport.hpp"

namespace tensorlane::sidecar {

/// A host buffer page-locked for CUDA copies; keeps its mapping until the pin is gone (members
/// are destroyed in reverse: the pin first, then the mapping).
struct LocalPin {
    std::shared_ptr<ipc::Mapping> mapping;
    std::shared_ptr<void> pinned;  ///< empty: locking failed; copies then stage through the driver
};

struct LocalJob {
    WriteOp op;
    uint64_t copied = 0;                ///< host copies: bytes done
    size_t extent = 0;                  ///< host copies: the range being copied (0 but scattered)
    uint64_t extent_copied = 0;         ///< and its bytes done
    bool gpu = false;                   ///< a CUDA region at either end
    bool issued = false;                ///< GPU: queued on a stream (or failed: `error`)
    uint32_t handle = 0;                ///< GPU: the copier's handle
    Status error;                       ///< GPU: why it could not be queued
    std::shared_ptr<LocalPin> pins[2];  ///< host ends kept page-locked while the copy runs
};

/// A write that has ended, as progress() reports it.
struct LocalDone {
    uint64_t op_id = 0;
    Code code = Code::kOk;
    std::string why;
    RegionId dst = 0;
    uint32_t imm = 0;
    uint64_t offset = 0;
    uint64_t bytes = 0;
    SessionId session = 0;         ///< the writer
    bool silent = false;           ///< WriteOp::silent: no arrived()
    std::vector<uint8_t> message;  ///< WriteOp::message: messageArrived() instead
};

/// The checks made when a write starts: kOk, or why it cannot (`*why`). A target deregistered
/// or unexposed after the post is not written.
Code checkStart(const WriteOp &op, const char **why);

/// The write of `sid` whose bytes are in place (a fenced memcpy, a finished CUDA copy): kOk, or
/// kNotFound when its target was revoked meanwhile (its owner is gone, so the writer hears
/// that rather than that the data was delivered, as the tcp transport answers).
LocalDone landed(const WriteOp &op, SessionId sid);

/// The write of `sid` that failed with `code`.
LocalDone failed(const WriteOp &op, SessionId sid, Code code, std::string why);

}  // namespace tensorlane::sidecar
