#include "transport/local/engine_gpu_copies.hpp"

#include <utility>

#include "cuda/copier.hpp"
#include "cuda/import.hpp"
#include "transport/local/gpu_copy.hpp"

namespace tensorlane::sidecar {

EngineGpuCopies::EngineGpuCopies() = default;

EngineGpuCopies::~EngineGpuCopies() {
    for (const auto &[sid, q] : sessions_) {
        waitGpuCopies(q, *copier_);
    }
}

bool EngineGpuCopies::fits(const LocalJob &job) {
    const auto imported = [](const Region &r) {
        return r.kind == MemoryKind::kCuda && r.cuda.import && r.cuda.import->imported();
    };
    return imported(*job.op.src) && imported(*job.op.dst);
}

bool EngineGpuCopies::full(SessionId sid) const {
    auto it = sessions_.find(sid);
    return it != sessions_.end() && it->second.size() >= kMaxInFlight;
}

void EngineGpuCopies::start(LocalJob job, SessionId sid) {
    if (!copier_) {
        copier_ = std::make_unique<CudaCopier>(CudaCopier::markFromEnv(CudaCopier::Mark::kAuto));
    }
    issueGpuCopy(job, *copier_, static_cast<uint32_t>(sid), nullptr);
    sessions_[sid].push_back(std::move(job));
    ++queued_;
    ++count_;
}

void EngineGpuCopies::poll(std::vector<LocalDone> *done, std::vector<SessionId> *drained) {
    for (auto it = sessions_.begin(); it != sessions_.end();) {
        std::deque<LocalJob> &q = it->second;
        while (!q.empty()) {
            LocalDone d;
            if (!pollGpuCopy(q.front(), *copier_, it->first, &d)) {
                break;
            }
            done->push_back(std::move(d));
            q.pop_front();
            --queued_;
        }
        if (q.empty()) {
            drained->push_back(it->first);
            it = sessions_.erase(it);
        } else {
            ++it;
        }
    }
}

}  // namespace tensorlane::sidecar
