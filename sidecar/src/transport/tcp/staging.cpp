#include "transport/tcp/staging.hpp"

#include <new>

#include "cuda/import.hpp"
#include "cuda/stager.hpp"

namespace tensorlane::sidecar {

TcpStaging::TcpStaging(uint32_t slot_bytes, uint32_t slots)
    : slot_bytes_(slot_bytes), slots_(slots) {}

TcpStaging::~TcpStaging() = default;

Status TcpStaging::ensureStarted() {
    if (started_) {
        return start_error_;
    }
    started_ = true;
    auto stager = std::make_unique<CudaStager>(slot_bytes_, slots_);
    start_error_ = stager->start();
    if (start_error_.isOk()) {
        stager_ = std::move(stager);
        for (uint32_t i = slots_; i-- > 0;) {
            free_.push_back(static_cast<int>(i));
        }
    }
    return start_error_;
}

int TcpStaging::wakeFd() const {
    return stager_ ? stager_->wakeFd() : -1;
}

int TcpStaging::take() {
    if (!ensureStarted().isOk() || free_.empty()) {
        return -1;
    }
    const int s = free_.back();
    free_.pop_back();
    return s;
}

void TcpStaging::give(int slot) {
    if (slot >= 0) {
        free_.push_back(slot);
    }
}

unsigned char *TcpStaging::data(int slot) const {
    return stager_->slot(static_cast<uint32_t>(slot));
}

void TcpStaging::copy(StagingClient *owner, uint64_t cookie, int slot,
                      const std::shared_ptr<CudaImport> &import, uint64_t device_offset,
                      uint32_t bytes, bool to_device) {
    const uint64_t id = next_job_++;
    pending_[id] = Pending{owner, cookie, slot};
    CudaStager::Job j;
    j.id = id;
    j.import = import;
    j.device_offset = device_offset;
    j.host = stager_->slot(static_cast<uint32_t>(slot));
    j.bytes = bytes;
    j.to_device = to_device;
    unsent_.push_back(std::move(j));
}

void TcpStaging::copyPieces(StagingClient *owner, uint64_t cookie, int slot,
                            const std::shared_ptr<CudaImport> &import,
                            const std::vector<Piece> &pieces, bool to_device) {
    const uint64_t id = next_job_++;
    pending_[id] = Pending{owner, cookie, slot};
    unsigned char *base = stager_->slot(static_cast<uint32_t>(slot));
    for (const Piece &x : pieces) {
        CudaStager::Job j;
        j.id = id;  // one id: the stager answers once, after the last piece
        j.import = import;
        j.device_offset = x.device_offset;
        j.host = base + x.slot_offset;
        j.bytes = x.bytes;
        j.to_device = to_device;
        unsent_.push_back(std::move(j));
    }
}

void TcpStaging::flush() {
    if (!unsent_.empty()) {
        stager_->submit(std::move(unsent_));
        unsent_.clear();
    }
}

bool TcpStaging::ready() const {
    return stager_ && stager_->ready();
}

size_t TcpStaging::dispatch() {
    if (!stager_) {
        return 0;
    }
    std::vector<CudaStager::Result> results;
    stager_->take(&results);
    for (const CudaStager::Result &r : results) {
        auto it = pending_.find(r.id);
        if (it == pending_.end()) {
            continue;
        }
        const Pending p = it->second;
        pending_.erase(it);
        if (p.owner != nullptr) {
            p.owner->staged(p.cookie, p.slot, r.status);
        } else {
            give(p.slot);  // its link went away while the copy ran
        }
    }
    return results.size();
}

void TcpStaging::forget(StagingClient *owner) {
    for (auto &[id, p] : pending_) {
        if (p.owner == owner) {
            p.owner = nullptr;
        }
    }
}

// ----- HostStaging

HostStaging::HostStaging(uint32_t bytes, size_t max_checks)
    : bytes_(bytes), max_checks_(max_checks), keep_(max_checks + 8) {}

HostStaging::Buffer HostStaging::take() {
    Buffer b;
    if (!free_.empty()) {
        b = std::move(free_.back());
        free_.pop_back();
    } else {
        // Not zeroed: every byte is written by the socket before it is read.
        b.reset(new (std::nothrow) uint8_t[bytes_]);
        if (!b) {
            return b;
        }
        ++made_;
    }
    ++lent_;
    return b;
}

void HostStaging::give(Buffer b) {
    if (!b) {
        return;
    }
    --lent_;
    if (free_.size() < keep_) {
        free_.push_back(std::move(b));
    } else {
        --made_;  // freed here
    }
}

bool HostStaging::startCheck() {
    if (checks_ >= max_checks_) {
        return false;
    }
    ++checks_;
    return true;
}

void HostStaging::endCheck() {
    if (checks_ > 0) {
        --checks_;
    }
}

}  // namespace tensorlane::sidecar
