#include "cq.hpp"

#include <cerrno>

#include "comp_channel.hpp"
#include "context.hpp"

namespace tensorlane::simhca {
namespace {

SimCq *exSelf(ibv_cq_ex *cq) {
    return handleOf<CqHandle>(cq)->self;
}

int exStart(ibv_cq_ex *cq, ibv_poll_cq_attr *) {
    return exSelf(cq)->startPoll();
}
int exNext(ibv_cq_ex *cq) {
    return exSelf(cq)->nextPoll();
}
void exEnd(ibv_cq_ex *cq) {
    exSelf(cq)->endPoll();
}
ibv_wc_opcode exOpcode(ibv_cq_ex *cq) {
    return exSelf(cq)->current().opcode;
}
uint32_t exVendorErr(ibv_cq_ex *cq) {
    return exSelf(cq)->current().vendor_err;
}
uint32_t exByteLen(ibv_cq_ex *cq) {
    return exSelf(cq)->current().byte_len;
}
__be32 exImm(ibv_cq_ex *cq) {
    return exSelf(cq)->current().imm_data;
}
uint32_t exQpNum(ibv_cq_ex *cq) {
    return exSelf(cq)->current().qp_num;
}
uint32_t exSrcQp(ibv_cq_ex *cq) {
    return exSelf(cq)->current().src_qp;
}
unsigned int exWcFlags(ibv_cq_ex *cq) {
    return exSelf(cq)->current().wc_flags;
}
uint32_t exSlid(ibv_cq_ex *cq) {
    return exSelf(cq)->current().slid;
}
uint8_t exSl(ibv_cq_ex *cq) {
    return exSelf(cq)->current().sl;
}
uint8_t exDlidPathBits(ibv_cq_ex *cq) {
    return exSelf(cq)->current().dlid_path_bits;
}
uint64_t exZero64(ibv_cq_ex *) {
    return 0;
}
uint16_t exZero16(ibv_cq_ex *) {
    return 0;
}
uint32_t exZero32(ibv_cq_ex *) {
    return 0;
}

}  // namespace

SimCq::SimCq(SimContext *ctx, int cqe, CompChannel *channel, void *cq_context, uint64_t wc_flags)
    : ctx_(ctx), channel_(channel), ring_(static_cast<size_t>(cqe)) {
    handle_.self = this;
    ibv_cq_ex &c = handle_.ibv;
    c.context = ctx->ibv();
    c.channel = channel != nullptr ? channel->ibv() : nullptr;
    c.cq_context = cq_context;
    c.cqe = cqe;
    pthread_mutex_init(&c.mutex, nullptr);
    pthread_cond_init(&c.cond, nullptr);
    c.comp_mask = 0;
    c.start_poll = exStart;
    c.next_poll = exNext;
    c.end_poll = exEnd;
    c.read_opcode = exOpcode;
    c.read_vendor_err = exVendorErr;
    c.read_byte_len = exByteLen;
    c.read_imm_data = exImm;
    c.read_qp_num = exQpNum;
    c.read_src_qp = exSrcQp;
    c.read_wc_flags = exWcFlags;
    c.read_slid = exSlid;
    c.read_sl = exSl;
    c.read_dlid_path_bits = exDlidPathBits;
    // Timestamps, VLANs and flow tags are not modelled; they read as zero.
    c.read_completion_ts = exZero64;
    c.read_completion_wallclock_ns = exZero64;
    c.read_cvlan = exZero16;
    c.read_flow_tag = exZero32;
    (void)wc_flags;
}

SimCq::~SimCq() {
    pthread_cond_destroy(&handle_.ibv.cond);
    pthread_mutex_destroy(&handle_.ibv.mutex);
}

bool SimCq::push(const ibv_wc &wc, bool solicited) {
    bool fire = false;
    bool overran = false;
    {
        std::lock_guard lock(mutex_);
        if (overrun_) {
            return false;
        }
        if (count_ == ring_.size()) {
            overrun_ = true;
            overran = true;
        } else {
            ring_[(head_ + count_) % ring_.size()] = wc;
            ++count_;
            available_.store(count_, std::memory_order_release);
            // IB spec 11.4.2.2: an armed CQ raises one event for the next completion, or for
            // the next solicited or error completion when armed for solicited only.
            if (armed_ == 1 || (armed_ == 2 && (solicited || wc.status != IBV_WC_SUCCESS))) {
                armed_ = 0;
                fire = true;
            }
        }
    }
    if (overran) {
        ibv_async_event ev{};
        ev.element.cq = ibv();
        ev.event_type = IBV_EVENT_CQ_ERR;
        ctx_->events().push(ev);
        return false;
    }
    if (fire && channel_ != nullptr) {
        channel_->notify(this);
    }
    return true;
}

bool SimCq::popLocked(ibv_wc &out) {
    if (count_ == 0) {
        return false;
    }
    out = ring_[head_];
    head_ = (head_ + 1) % ring_.size();
    --count_;
    available_.store(count_, std::memory_order_release);
    return true;
}

int SimCq::poll(int n, ibv_wc *wc) {
    if (available_.load(std::memory_order_acquire) == 0) {
        return 0;
    }
    std::lock_guard lock(mutex_);
    int got = 0;
    while (got < n && popLocked(wc[got])) {
        ++got;
    }
    return got;
}

int SimCq::arm(bool solicited_only) {
    std::lock_guard lock(mutex_);
    armed_ = solicited_only ? 2 : 1;
    return 0;
}

int SimCq::resize(int cqe) {
    std::lock_guard lock(mutex_);
    if (cqe < static_cast<int>(count_) || cqe < 1) {
        return EINVAL;
    }
    std::vector<ibv_wc> ring(static_cast<size_t>(cqe));
    for (size_t i = 0; i < count_; ++i) {
        ring[i] = ring_[(head_ + i) % ring_.size()];
    }
    ring_ = std::move(ring);
    head_ = 0;
    handle_.ibv.cqe = cqe;
    return 0;
}

int SimCq::startPoll() {
    if (available_.load(std::memory_order_acquire) == 0) {
        return ENOENT;
    }
    mutex_.lock();
    if (!popLocked(current_)) {
        mutex_.unlock();
        return ENOENT;
    }
    handle_.ibv.wr_id = current_.wr_id;
    handle_.ibv.status = current_.status;
    return 0;
}

int SimCq::nextPoll() {
    if (!popLocked(current_)) {
        return ENOENT;
    }
    handle_.ibv.wr_id = current_.wr_id;
    handle_.ibv.status = current_.status;
    return 0;
}

void SimCq::endPoll() {
    mutex_.unlock();
}

}  // namespace tensorlane::simhca
