#include "cuda/import.hpp"

namespace tensorlane::sidecar {

CudaImport::CudaImport(const CudaIpcHandle &handle, int ordinal, uint64_t alloc_bytes,
                       std::shared_ptr<ipc::UniqueFd> dmabuf, uint32_t uid)
    : handle_(handle),
      ordinal_(ordinal),
      alloc_bytes_(alloc_bytes),
      dmabuf_(std::move(dmabuf)),
      uid_(uid) {}

CudaImport::CudaImport(std::vector<VmmPieceFd> pieces, int ordinal, uint64_t alloc_bytes,
                       uint64_t owner_address, std::shared_ptr<ipc::UniqueFd> dmabuf, bool host)
    : handle_{},
      ordinal_(ordinal),
      alloc_bytes_(alloc_bytes),
      dmabuf_(std::move(dmabuf)),
      uid_(0),
      vmm_(true),
      host_(host),
      pieces_(std::move(pieces)),
      owner_address_(owner_address) {}

CudaImport::~CudaImport() {
    std::shared_ptr<CudaIpcMapping> m;
    std::shared_ptr<void> v;
    {
        std::lock_guard lock(mu_);
        m = std::move(mapping_);
        v = std::move(vmm_mapping_);
    }
    if (m || v) {
        // The closure owns what may be the last reference: the mapping is closed on the release
        // thread, never on the thread that dropped the region.
        CudaRuntime::get().defer([m = std::move(m), v = std::move(v)]() mutable {
            m.reset();
            v.reset();
        });
    }
}

Status CudaImport::base(uint64_t *out) {
    std::lock_guard lock(mu_);
    if (vmm_) {
        if (!vmm_mapping_) {
            if (!failed_.isOk()) {
                return failed_;
            }
            if (ordinal_ < 0) {
                failed_ = {Code::kCuda, "the owner's GPU is not visible to the sidecar"};
                return failed_;
            }
            Status st = CudaRuntime::get().mapVmm(pieces_, ordinal_, alloc_bytes_, owner_address_,
                                                  host_, &vmm_mapping_, &vmm_base_);
            pieces_.clear();  // their fds close here, mapped or not (a failure is not retried)
            if (!st.isOk()) {
                failed_ = st;
                return st;
            }
        }
        *out = vmm_base_;
        return Status::ok();
    }
    if (!mapping_) {
        if (!failed_.isOk()) {
            return failed_;
        }
        if (ordinal_ < 0) {
            failed_ = {Code::kCuda, "the owner's GPU is not visible to the sidecar"};
            return failed_;
        }
        Status st = CudaRuntime::get().openIpc(handle_, ordinal_, uid_, &mapping_);
        if (!st.isOk()) {
            failed_ = st;
            return st;
        }
    }
    *out = mapping_->base();
    return Status::ok();
}

Status CudaImport::verify() {
    uint64_t base_address = 0;
    if (Status st = base(&base_address); !st.isOk()) {
        return st;
    }
    uint64_t real = 0;
    {
        // VMM: every piece was mapped whole at the size the client gave, so the span is real.
        std::lock_guard lock(mu_);
        real = vmm_ ? alloc_bytes_ : mapping_->bytes();
    }
    if (alloc_bytes_ > real) {
        return {Code::kInvalid, "the client says its CUDA allocation holds " +
                                    std::to_string(alloc_bytes_) + " bytes; the sidecar's import " +
                                    "of it holds " + std::to_string(real)};
    }
    verified_.store(true, std::memory_order_release);
    return Status::ok();
}

bool CudaImport::imported() const {
    std::lock_guard lock(mu_);
    return mapping_ != nullptr || vmm_mapping_ != nullptr;
}

}  // namespace tensorlane::sidecar
