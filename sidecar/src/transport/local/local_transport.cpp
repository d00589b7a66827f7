#include "transport/local/local_transport.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "cuda/copier.hpp"
#include "cuda/import.hpp"
#include "cuda/runtime.hpp"
#include "tensorlane/ipc/doorbell.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tensorlane::sidecar {
namespace {

/// Writes at least this large stream past the caches (non-temporal stores): they would evict
/// most of the last-level cache anyway, and streaming saves the read-for-ownership of every
/// target line. A quarter of the last-level cache, the rule of glibc 2.38 and later (x86
/// cacheinfo: "non_temporal_threshold ~= sizeof_L3 / 4"), which our 512 KiB slices would
/// otherwise never reach. Measured on a 300 MiB-LLC Xeon: at 3/4 of it, 256 MiB writes stayed
/// temporal and reached only 80% of glibc's streaming memcpy.
uint64_t streamingThreshold() {
    static const uint64_t threshold = [] {
        long llc = ::sysconf(_SC_LEVEL3_CACHE_SIZE);
        return llc > 0 ? static_cast<uint64_t>(llc) / 4 : uint64_t{8} << 20;
    }();
    return threshold;
}

#if defined(__x86_64__)
/// Copies up to a 64-byte aligned destination; returns the bytes copied.
uint64_t copyHead(unsigned char *dst, const unsigned char *src, uint64_t n) {
    const uint64_t head =
        std::min<uint64_t>((64 - (reinterpret_cast<uintptr_t>(dst) & 63)) & 63, n);
    std::memcpy(dst, src, head);
    return head;
}

/// Non-temporal copy with 32-byte AVX2 stores, two lines per turn. Measured on the GPU
/// machine's Xeon, 256 MiB in 512 KiB slices: 91-97% of glibc's memcpy, where SSE2 stores
/// reach 75-87%.
__attribute__((target("avx2"))) void copyStreamingAvx2(unsigned char *dst, const unsigned char *src,
                                                       uint64_t n) {
    const uint64_t head = copyHead(dst, src, n);
    dst += head;
    src += head;
    n -= head;
    for (; n >= 128; n -= 128, dst += 128, src += 128) {
        const auto *s = reinterpret_cast<const __m256i *>(src);
        auto *d = reinterpret_cast<__m256i *>(dst);
        __m256i a = _mm256_loadu_si256(s), b = _mm256_loadu_si256(s + 1);
        __m256i c = _mm256_loadu_si256(s + 2), e = _mm256_loadu_si256(s + 3);
        _mm256_stream_si256(d, a);
        _mm256_stream_si256(d + 1, b);
        _mm256_stream_si256(d + 2, c);
        _mm256_stream_si256(d + 3, e);
    }
    std::memcpy(dst, src, n);
}
#endif

/// memcpy with non-temporal stores where the CPU has AVX2 (every x86 server CPU since 2013);
/// elsewhere plain memcpy. The caller fences before anyone may look at the bytes.
void copyStreaming(unsigned char *dst, const unsigned char *src, uint64_t n) {
#if defined(__x86_64__)
    static const bool avx2 = __builtin_cpu_supports("avx2");
    if (avx2) {
        copyStreamingAvx2(dst, src, n);
    } else {
        std::memcpy(dst, src, n);
    }
#else
    std::memcpy(dst, src, n);
#endif
}

void storeFence() {
#if defined(__x86_64__)
    // Non-temporal stores are weakly ordered: make them visible before the notification.
    _mm_sfence();
#endif
}

}  // namespace

/// A host buffer page-locked for CUDA copies; keeps its mapping until the pin is gone (members
/// are destroyed in reverse: the pin first, then the mapping).
struct LocalTransport::Pin {
    std::shared_ptr<ipc::Mapping> mapping;
    std::shared_ptr<void> pinned;  ///< empty: locking failed; copies then stage through the driver
};

struct LocalTransport::CopierHolder {
    CudaCopier copier;
};

LocalTransport::LocalTransport(std::string node_name, size_t max_queued)
    : node_name_(std::move(node_name)), max_queued_(max_queued) {}

LocalTransport::~LocalTransport() {
    for (auto &[sid, own] : own_) {
        waitQueued(own.gpu, own_copier_->copier);
    }
    own_.clear();
    own_copier_.reset();
    {
        std::lock_guard lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) {
        thread_.join();
    }
}

void LocalTransport::setPolling(bool busy, uint32_t spin_us) {
    // Even a busy-polling sidecar's copy thread sleeps once local writes stop coming for a
    // while: it would otherwise take a whole core from the engine and the clients (on a 2-core
    // machine, three spinning threads slow a no-op round trip a hundredfold). While writes
    // come, it stays awake, so each one costs no wake-up.
    constexpr uint32_t kBusySpinUs = 500;
    spin_us_ = busy ? std::max(spin_us, kBusySpinUs) : spin_us;
}

Status LocalTransport::start() {
    if (int rc = ipc::makeEventFd(&wake_)) {
        return {Code::kInternal, std::string("eventfd: ") + std::strerror(rc)};
    }
    thread_ = std::thread([this] { run(); });
    return Status::ok();
}

Status LocalTransport::post(const WriteOp &op) {
    if (!op.dst || !op.src) {
        return {Code::kInvalid, "local write without a resolved source and target"};
    }
    if (in_flight_ >= max_queued_) {
        return {Code::kAgain, "the local copy queue is full"};
    }
    Job job;
    job.op = op;
    job.gpu = op.src->kind == MemoryKind::kCuda || op.dst->kind == MemoryKind::kCuda;
    ++in_flight_;
    route(op.src->owner, std::move(job));
    return Status::ok();
}

void LocalTransport::route(SessionId sid, Job job) {
    auto own = own_.find(sid);
    if (own != own_.end() && !own->second.held.empty()) {
        own->second.held.push_back(std::move(job));  // behind the ones held before it
        return;
    }
    if (!handed_.contains(sid)) {
        // Nothing of this session's is on the copy thread.
        const bool own_gpu = own != own_.end() && !own->second.gpu.empty();
        const WriteOp &op = job.op;
        if (!job.gpu && op.bytes <= kInlineBytes && !own_gpu) {
            Done d;
            (void)stepHost(job, &d);  // finishes: one slice
            inline_done_.push_back(std::move(d));
            ++inline_writes_;
            return;
        }
        // Both ends already imported (an import may take milliseconds: the copy thread's).
        const auto imported = [](const Region &r) {
            return r.kind == MemoryKind::kCuda && r.cuda.import && r.cuda.import->imported();
        };
        if (imported(*op.src) && imported(*op.dst) &&
            (!own_gpu || own->second.gpu.size() < kMaxGpuInFlight)) {
            if (!own_copier_) {
                own_copier_ = std::make_unique<CopierHolder>();
            }
            issueGpu(job, own_copier_->copier, static_cast<uint32_t>(sid));
            own_[sid].gpu.push_back(std::move(job));
            ++own_gpu_;
            ++inline_gpu_writes_;
            return;
        }
        if (own_gpu) {
            own->second.held.push_back(std::move(job));  // handed on once they have finished
            return;
        }
    }
    handOver(sid, std::move(job));
}

void LocalTransport::handOver(SessionId sid, Job job) {
    ++handed_[sid];
    std::lock_guard lock(mu_);
    incoming_.push_back(std::move(job));
    has_incoming_.store(true, std::memory_order_release);
    if (sleeping_) {
        cv_.notify_one();
    }
}

void LocalTransport::progressOwn(std::vector<Done> *done) {
    std::vector<std::pair<SessionId, std::deque<Job>>> release;
    for (auto it = own_.begin(); it != own_.end();) {
        std::deque<Job> &q = it->second.gpu;
        while (!q.empty()) {
            Done d;
            if (!pollGpu(q.front(), own_copier_->copier, it->first, &d)) {
                break;
            }
            done->push_back(std::move(d));
            q.pop_front();
            --own_gpu_;
        }
        if (q.empty()) {
            release.emplace_back(it->first, std::move(it->second.held));
            it = own_.erase(it);
        } else {
            ++it;
        }
    }
    // Sent on in posting order; the first may queue on our copier again, and those after it
    // are then held behind it once more.
    for (auto &[sid, held] : release) {
        for (Job &j : held) {
            route(sid, std::move(j));
        }
    }
}

void LocalTransport::deregisterRegion(RegionId r) {
    std::lock_guard lock(mu_);
    retired_.push_back(r);
    has_incoming_.store(true, std::memory_order_release);
    if (sleeping_) {
        cv_.notify_one();
    }
}

bool LocalTransport::arm() {
    if (!inline_done_.empty() || own_gpu_ != 0) {
        return false;  // copied in post(), or our GPU copies to poll: progress() reports them
    }
    armed_.store(true, std::memory_order_relaxed);
    // SYNC POINT: seq_cst fence between raising armed_ and reading done_ready_; the copy thread
    // stores done_ready_, fences, then reads armed_ (Dekker): either we see its work here, or it
    // sees that we may sleep and rings the eventfd.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return !done_ready_.load(std::memory_order_relaxed);
}

Code LocalTransport::startCheck(const WriteOp &op, const char **why) {
    // Checked when the copy starts: a target deregistered or unexposed after the post is not
    // written. The shared_ptrs keep both ranges (and CUDA imports) alive for as long as we copy.
    if (op.dst->revoked.load(std::memory_order_acquire) ||
        !op.dst->exposed.load(std::memory_order_acquire)) {
        *why = "target region is gone";
        return Code::kNotFound;
    }
    const auto usable = [](const Region &r) {
        return r.kind == MemoryKind::kCuda ? r.cuda.import != nullptr : r.base != nullptr;
    };
    if (!usable(*op.dst) || !usable(*op.src) || !op.dst->contains(op.dst_offset, op.bytes) ||
        !op.src->contains(op.src_offset, op.bytes)) {
        *why = "write out of bounds";
        return Code::kInvalid;
    }
    return Code::kOk;
}

bool LocalTransport::stepHost(Job &job, Done *done) {
    const WriteOp &op = job.op;
    if (job.copied == 0) {
        const char *why = "";
        if (Code code = startCheck(op, &why); code != Code::kOk) {
            *done = Done{op.op_id, code, why, 0, 0, 0, 0};
            return true;
        }
    }
    const uint64_t n = std::min(op.bytes - job.copied, kSliceBytes);
    unsigned char *to = op.dst->base + op.dst_offset + job.copied;
    const unsigned char *from = op.src->base + op.src_offset + job.copied;
    if (op.bytes >= streamingThreshold()) {
        copyStreaming(to, from, n);
    } else {
        std::memcpy(to, from, n);
    }
    job.copied += n;
    if (job.copied < op.bytes) {
        return false;
    }
    storeFence();
    // A target revoked while we copied: its owner is gone, so the writer hears that rather than
    // that the data was delivered (as the tcp transport answers).
    if (op.dst->revoked.load(std::memory_order_acquire)) {
        *done = Done{
            op.op_id, Code::kNotFound, "target region was deregistered during the write", 0, 0, 0,
            0};
        return true;
    }
    *done = Done{op.op_id, Code::kOk, "", op.dst_region, op.imm, op.dst_offset, op.bytes};
    return true;
}

Status LocalTransport::addressOf(const Region &r, uint64_t offset, uint64_t *addr,
                                 std::shared_ptr<Pin> *pin) {
    if (r.kind == MemoryKind::kCuda) {
        uint64_t base = 0;
        if (Status st = r.cuda.import->base(&base); !st.isOk()) {
            return st;
        }
        *addr = base + r.cuda.alloc_offset + offset;
        return Status::ok();
    }
    // Host memory: the whole buffer (the root region) is page-locked once, on first use, so
    // the copy engine reaches it directly instead of through the driver's bounce buffers.
    const RegionId root = r.parent != 0 ? r.parent : r.id;
    auto it = pins_.find(root);
    if (it == pins_.end()) {
        auto p = std::make_shared<Pin>();
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

void LocalTransport::issueGpu(Job &job, CudaCopier &copier, uint32_t lane) {
    const WriteOp &op = job.op;
    job.issued = true;
    const char *why = "";
    if (Code code = startCheck(op, &why); code != Code::kOk) {
        job.error = Status{code, why};
        return;
    }
    uint64_t src = 0, dst = 0;
    Status st = addressOf(*op.src, op.src_offset, &src, &job.pins[0]);
    if (st.isOk()) {
        st = addressOf(*op.dst, op.dst_offset, &dst, &job.pins[1]);
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

void LocalTransport::waitQueued(const std::deque<Job> &q, CudaCopier &copier) {
    for (const Job &j : q) {
        if (j.gpu && j.issued && j.error.isOk()) {
            while (copier.poll(j.handle).code() == Code::kAgain) {
            }
        }
    }
}

bool LocalTransport::pollGpu(Job &job, CudaCopier &copier, SessionId sid, Done *done) {
    Status st = job.error;
    if (st.isOk()) {
        st = copier.poll(job.handle);
        if (st.code() == Code::kAgain) {
            return false;
        }
    }
    *done = finishGpu(job, st);
    done->session = sid;
    return true;
}

LocalTransport::Done LocalTransport::finishGpu(Job &job, const Status &st) {
    const WriteOp &op = job.op;
    if (!st.isOk()) {
        return Done{op.op_id, st.code(), st.message(), 0, 0, 0, 0};
    }
    if (op.dst->revoked.load(std::memory_order_acquire)) {
        return Done{
            op.op_id, Code::kNotFound, "target region was deregistered during the write", 0, 0, 0,
            0};
    }
    // The event has completed: the copy engine's writes are done, in device memory for a CUDA
    // target and in host memory for a host one, before the owner is told.
    return Done{op.op_id, Code::kOk, "", op.dst_region, op.imm, op.dst_offset, op.bytes};
}

bool LocalTransport::turn(std::vector<Done> *done) {
    bool moved = false;
    for (auto it = jobs_.begin(); it != jobs_.end();) {
        std::deque<Job> &q = it->second;
        // GPU copies at the front that have finished, in order.
        while (!q.empty() && q.front().gpu && q.front().issued) {
            Done d;
            if (!pollGpu(q.front(), copier_->copier, it->first, &d)) {
                break;
            }
            done->push_back(std::move(d));
            q.pop_front();
            moved = true;
        }
        // The next job that has not started: GPU copies queue behind each other; a host copy
        // only once nothing of this session is on the GPU any more.
        size_t k = 0;
        while (k < q.size() && q[k].gpu && q[k].issued) {
            ++k;
        }
        if (k < q.size()) {
            Job &j = q[k];
            if (j.gpu && k < kMaxGpuInFlight) {
                issueGpu(j, copier_->copier, static_cast<uint32_t>(it->first));
                moved = true;
            } else if (!j.gpu && k == 0) {
                Done d;
                if (stepHost(j, &d)) {
                    d.session = it->first;
                    done->push_back(std::move(d));
                    q.pop_front();
                }
                moved = true;
            }
        }
        it = q.empty() ? jobs_.erase(it) : std::next(it);
    }
    return moved;
}

void LocalTransport::publish(std::vector<Done> *done) {
    if (done->empty()) {
        return;
    }
    {
        std::lock_guard lock(mu_);
        for (Done &d : *done) {
            done_.push_back(std::move(d));
        }
        done_ready_.store(true, std::memory_order_relaxed);
    }
    done->clear();
    // SYNC POINT: pairs with arm(): done_ready_ is stored, then armed_ read, across a seq_cst
    // fence. An engine that is awake finds the work through done_ready_ without a syscall.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (armed_.load(std::memory_order_relaxed)) {
        // Rung first, flagged second: progress() drains only after seeing the flag, so a drain
        // can never run before the ring it is meant for and leave the eventfd readable.
        ipc::ring(wake_.get());
        rung_.store(true, std::memory_order_release);
    }
}

void LocalTransport::run() {
    using Clock = std::chrono::steady_clock;
    copier_ = std::make_unique<CopierHolder>();
    std::vector<Done> done;
    std::vector<RegionId> retired;
    auto last_work = Clock::now();
    for (;;) {
        {
            std::unique_lock lock(mu_);
            if (jobs_.empty() && incoming_.empty() && retired_.empty() && !stop_) {
                const bool spin = Clock::now() - last_work < std::chrono::microseconds(spin_us_);
                if (spin) {
                    // Spin outside the lock: post() only takes it to hand over work.
                    lock.unlock();
                    while (!has_incoming_.load(std::memory_order_acquire) &&
                           Clock::now() - last_work < std::chrono::microseconds(spin_us_)) {
#if defined(__x86_64__)
                        _mm_pause();
#endif
                    }
                    continue;
                }
                sleeping_ = true;
                cv_.wait(lock, [this] { return stop_ || !incoming_.empty() || !retired_.empty(); });
                sleeping_ = false;
            }
            if (stop_) {
                break;
            }
            for (Job &j : incoming_) {
                const SessionId sid = j.op.src->owner;
                jobs_[sid].push_back(std::move(j));
            }
            incoming_.clear();
            retired.swap(retired_);
            has_incoming_.store(false, std::memory_order_relaxed);
        }
        // Outside the lock: unlocking host memory may take a while, and post() must not wait.
        for (RegionId r : retired) {
            pins_.erase(r);  // copies still running hold their own reference
        }
        retired.clear();
        if (turn(&done)) {
            last_work = Clock::now();
        }
        publish(&done);
    }
    for (auto &[sid, q] : jobs_) {
        waitQueued(q, copier_->copier);
    }
    jobs_.clear();
    pins_.clear();
    copier_.reset();
}

size_t LocalTransport::progress(EventSink &sink) {
    armed_.store(false, std::memory_order_relaxed);
    if (rung_.load(std::memory_order_acquire) && rung_.exchange(false)) {
        ipc::drain(wake_.get());  // only when it was rung: no syscall on the busy path
    }
    // Ours first: a session's writes finished on the engine thread were posted before anything
    // of it that went to the copy thread since. Of ours, the ones copied in post() came before
    // any GPU copy of their session still queued on our copier; those sent on after our GPU
    // copies finished come after them.
    std::vector<Done> done = std::exchange(inline_done_, {});
    if (own_gpu_ != 0) {
        progressOwn(&done);
        for (Done &d : inline_done_) {
            done.push_back(std::move(d));
        }
        inline_done_.clear();
    }
    const size_t own_count = done.size();
    if (done_ready_.load(std::memory_order_acquire)) {
        std::lock_guard lock(mu_);
        for (Done &d : done_) {
            done.push_back(std::move(d));
        }
        done_.clear();
        done_ready_.store(false, std::memory_order_relaxed);
    }
    if (done.empty()) {
        return 0;
    }
    for (size_t i = 0; i < done.size(); ++i) {
        const Done &d = done[i];
        --in_flight_;
        if (i >= own_count) {
            if (auto n = handed_.find(d.session); n != handed_.end() && --n->second == 0) {
                handed_.erase(n);
            }
        }
        if (d.code == Code::kOk) {
            // The bytes are in place and visible (a fenced memcpy, or a finished CUDA copy). The
            // owner first, then the writer, as DESIGN.md's data path requires.
            sink.arrived(d.dst, d.imm, d.offset, d.bytes, node_name_);
        }
        sink.completed(d.op_id, d.code, d.why);
    }
    return done.size() * 2;
}

}  // namespace tensorlane::sidecar
