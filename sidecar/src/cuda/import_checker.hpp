// The check of a client's first registration in a CUDA allocation, off the engine thread: the
// sidecar imports the allocation (cuIpcOpenMemHandle; the first import on a device also makes
// its primary context, hundreds of milliseconds) and compares the owner's claims with what the
// driver says of its own mapping (CudaImport::verify). The engine submits a job and answers the
// client when the result comes back through an eventfd it polls; later registrations in a
// verified allocation are answered at once.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cuda/import.hpp"
#include "tensorlane/ipc/control.hpp"
#include "tensorlane/ipc/fd.hpp"
#include "tensorlane/sidecar/status.hpp"

namespace tensorlane::sidecar {

class CudaImportChecker {
public:
    struct Job {
        uint64_t session = 0;  ///< the engine's SessionId of the registering client
        ipc::RegisterMsg msg{};
        std::shared_ptr<CudaImport> import;
    };
    struct Result {
        Job job;
        Status status;
    };

    /// Starts the thread; null (and `st` says why) when the eventfd cannot be made.
    static std::unique_ptr<CudaImportChecker> create(Status *st);
    /// Takes the jobs not started yet back (their imports are released here), joins the thread.
    ~CudaImportChecker();
    CudaImportChecker(const CudaImportChecker &) = delete;
    CudaImportChecker &operator=(const CudaImportChecker &) = delete;

    /// Readable while results wait (engine thread: epoll).
    int fd() const { return event_.get(); }
    void submit(Job job);
    /// The results so far, in the order they finished (engine thread).
    std::vector<Result> take();

private:
    CudaImportChecker() = default;
    void loop();

    ipc::UniqueFd event_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Job> jobs_;
    std::vector<Result> results_;
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace tensorlane::sidecar
