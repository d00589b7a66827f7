#include "transport/local/gpu_copy.hpp"

#include "cuda/copier.hpp"
#include "cuda/import.hpp"
#include "cuda/runtime.hpp"

namespace tensorlane::sidecar {
namespace {

/// The unified address of `offset` in CUDA region `r` (importing it on first use).
Status deviceAddress(const Region &r, uint64_t offset, uint64_t *addr) {
    uint64_t base = 0;
    if (Status st = r.cuda.import->base(&base); !st.isOk()) {
        return st;
    }
    *addr = base + r.cuda.alloc_offset + offset;
    return Status::ok();
}

}  // namespace

Status HostPins::addressOf(const Region &r, uint64_t offset, uint64_t *addr,
                           std::shared_ptr<LocalPin> *pin) {
    const RegionId root = r.parent != 0 ? r.parent : r.id;
    auto it = pins_.find(root);
    if (it == pins_.end()) {
        auto p = std::make_shared<LocalPin>();
        p->mapping = r.mapping;
        if (r.mapping) {
            // A failure leaves the copy correct, only staged by the driver: not an error.
            (void)CudaRuntime::get().pinHost(r.mapping->data(), r.mapping->size(), &p->pinned);
        }
        it = pins_.emplace(root, std::move(p)).first;
    }
    *pin = it->second;
    *addr = reinterpret_cast<uint64_t>(r.base + offset);
    return Status::ok();
}

void issueGpuCopy(LocalJob &job, CudaCopier &copier, uint32_t lane, HostPins *pins) {
    const WriteOp &op = job.op;
    job.issued = true;
    const char *why = "";
    if (Code code = checkStart(op, &why); code != Code::kOk) {
        job.error = Status{code, why};
        return;
    }
    const auto address = [pins](const Region &r, uint64_t offset, uint64_t *addr,
                                std::shared_ptr<LocalPin> *pin) {
        if (r.kind == MemoryKind::kCuda) {
            return deviceAddress(r, offset, addr);
        }
        if (pins == nullptr) {
            return Status{Code::kInternal, "a host end on a path for GPU-to-GPU copies"};
        }
        return pins->addressOf(r, offset, addr, pin);
    };
    uint64_t src = 0, dst = 0;
    Status st = address(*op.src, op.src_offset, &src, &job.pins[0]);
    if (st.isOk()) {
        st = address(*op.dst, op.dst_offset, &dst, &job.pins[1]);
    }
    if (st.isOk()) {
        // The stream of the device at the CUDA end (the target's when both are).
        const CudaImport &gpu =
            op.dst->kind == MemoryKind::kCuda ? *op.dst->cuda.import : *op.src->cuda.import;
        st = copier.start(gpu.ordinal(), lane, dst, src, op.bytes, &job.handle);
    }
    if (!st.isOk()) {
        job.error = st;
    }
}

bool pollGpuCopy(LocalJob &job, CudaCopier &copier, SessionId sid, LocalDone *done) {
    Status st = job.error;
    if (st.isOk()) {
        st = copier.poll(job.handle);
        if (st.code() == Code::kAgain) {
            return false;
        }
    }
    if (!st.isOk()) {
        *done = failed(job.op, sid, st.code(), st.message());
        return true;
    }
    // The event has completed: the copy engine's writes are done, in device memory for a CUDA
    // target and in host memory for a host one, before the owner is told.
    *done = landed(job.op, sid);
    return true;
}

void waitGpuCopies(const std::deque<LocalJob> &q, CudaCopier &copier) {
    for (const LocalJob &j : q) {
        if (j.gpu && j.issued && j.error.isOk()) {
            while (copier.poll(j.handle).code() == Code::kAgain) {
            }
        }
    }
}

}  // namespace tensorlane::sidecar
