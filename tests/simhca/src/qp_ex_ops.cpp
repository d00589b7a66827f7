#include "qp_ex_ops.hpp"

#include <cerrno>
#include <cstring>

#include "qp.hpp"

namespace tensorlane::simhca {

/// The builders (friend of SimQp for its batch).
struct QpExOps {
    static SimQp &qpOf(ibv_qp_ex *q) { return *SimQp::from(&q->qp_base); }
    static QpExBatch &batch(ibv_qp_ex *q) { return qpOf(q).ex_; }

    static void start(ibv_qp_ex *q) {
        QpExBatch &b = batch(q);
        b.wrs.clear();
        b.sge_first.clear();
        b.sges.clear();
        b.inline_bytes.clear();
        b.error = 0;
    }
    static ibv_send_wr &add(ibv_qp_ex *q, ibv_wr_opcode op) {
        QpExBatch &b = batch(q);
        ibv_send_wr wr{};
        wr.wr_id = q->wr_id;
        wr.send_flags = q->wr_flags;
        wr.opcode = op;
        b.wrs.push_back(wr);
        b.sge_first.push_back(static_cast<uint32_t>(b.sges.size()));
        return b.wrs.back();
    }
    static void rdmaWrite(ibv_qp_ex *q, uint32_t rkey, uint64_t addr) {
        ibv_send_wr &wr = add(q, IBV_WR_RDMA_WRITE);
        wr.wr.rdma.rkey = rkey;
        wr.wr.rdma.remote_addr = addr;
    }
    static void rdmaWriteImm(ibv_qp_ex *q, uint32_t rkey, uint64_t addr, __be32 imm) {
        ibv_send_wr &wr = add(q, IBV_WR_RDMA_WRITE_WITH_IMM);
        wr.wr.rdma.rkey = rkey;
        wr.wr.rdma.remote_addr = addr;
        wr.imm_data = imm;
    }
    static void rdmaRead(ibv_qp_ex *q, uint32_t rkey, uint64_t addr) {
        ibv_send_wr &wr = add(q, IBV_WR_RDMA_READ);
        wr.wr.rdma.rkey = rkey;
        wr.wr.rdma.remote_addr = addr;
    }
    static void send(ibv_qp_ex *q) { add(q, IBV_WR_SEND); }
    static void sendImm(ibv_qp_ex *q, __be32 imm) { add(q, IBV_WR_SEND_WITH_IMM).imm_data = imm; }
    static void unsupported(ibv_qp_ex *q) { batch(q).error = EOPNOTSUPP; }
    static void atomicCmpSwp(ibv_qp_ex *q, uint32_t, uint64_t, uint64_t, uint64_t) {
        unsupported(q);
    }
    static void atomicFetchAdd(ibv_qp_ex *q, uint32_t, uint64_t, uint64_t) { unsupported(q); }
    static void bindMw(ibv_qp_ex *q, ibv_mw *, uint32_t, const ibv_mw_bind_info *) {
        unsupported(q);
    }
    static void localInv(ibv_qp_ex *q, uint32_t) { unsupported(q); }
    static void sendInv(ibv_qp_ex *q, uint32_t) { unsupported(q); }
    static void sendTso(ibv_qp_ex *q, void *, uint16_t, uint16_t) { unsupported(q); }
    static void setUdAddr(ibv_qp_ex *q, ibv_ah *, uint32_t, uint32_t) { unsupported(q); }
    static void setXrcSrqn(ibv_qp_ex *q, uint32_t) { unsupported(q); }
    static void setSge(ibv_qp_ex *q, uint32_t lkey, uint64_t addr, uint32_t length) {
        QpExBatch &b = batch(q);
        if (b.wrs.empty()) {
            b.error = EINVAL;
            return;
        }
        b.sges.resize(b.sge_first.back());
        b.sges.push_back(ibv_sge{addr, length, lkey});
        b.wrs.back().num_sge = 1;
    }
    static void setSgeList(ibv_qp_ex *q, size_t n, const ibv_sge *list) {
        QpExBatch &b = batch(q);
        if (b.wrs.empty()) {
            b.error = EINVAL;
            return;
        }
        b.sges.resize(b.sge_first.back());
        b.sges.insert(b.sges.end(), list, list + n);
        b.wrs.back().num_sge = static_cast<int>(n);
    }
    static void setInline(ibv_qp_ex *q, void *addr, size_t length) {
        const ibv_data_buf buf{addr, length};
        setInlineList(q, 1, &buf);
    }
    static void setInlineList(ibv_qp_ex *q, size_t n, const ibv_data_buf *list) {
        QpExBatch &b = batch(q);
        if (b.wrs.empty()) {
            b.error = EINVAL;
            return;
        }
        // The data is copied now: ibv_wr_set_inline_data(3) lets the caller reuse the buffer
        // as soon as the call returns. Addresses are fixed up in complete().
        b.sges.resize(b.sge_first.back());
        for (size_t i = 0; i < n; ++i) {
            const size_t at = b.inline_bytes.size();
            const auto *p = static_cast<const uint8_t *>(list[i].addr);
            b.inline_bytes.insert(b.inline_bytes.end(), p, p + list[i].length);
            b.sges.push_back(ibv_sge{at, static_cast<uint32_t>(list[i].length), 0});
        }
        b.wrs.back().num_sge = static_cast<int>(n);
        b.wrs.back().send_flags |= IBV_SEND_INLINE;
    }
    static int complete(ibv_qp_ex *q) {
        QpExBatch &b = batch(q);
        if (b.error != 0 || b.wrs.empty()) {
            const int err = b.error;
            start(q);
            return err;
        }
        for (size_t i = 0; i < b.wrs.size(); ++i) {
            ibv_send_wr &wr = b.wrs[i];
            wr.next = i + 1 < b.wrs.size() ? &b.wrs[i + 1] : nullptr;
            wr.sg_list = wr.num_sge > 0 ? &b.sges[b.sge_first[i]] : nullptr;
            if (wr.send_flags & IBV_SEND_INLINE) {
                for (int s = 0; s < wr.num_sge; ++s) {
                    wr.sg_list[s].addr =
                        reinterpret_cast<uint64_t>(b.inline_bytes.data() + wr.sg_list[s].addr);
                }
            }
        }
        ibv_send_wr *bad = nullptr;
        const int err = qpOf(q).postSend(b.wrs.data(), &bad);
        start(q);
        return err;
    }
    static void abort(ibv_qp_ex *q) { start(q); }
};

void installQpExOps(ibv_qp_ex *q) {
    q->wr_atomic_cmp_swp = QpExOps::atomicCmpSwp;
    q->wr_atomic_fetch_add = QpExOps::atomicFetchAdd;
    q->wr_bind_mw = QpExOps::bindMw;
    q->wr_local_inv = QpExOps::localInv;
    q->wr_rdma_read = QpExOps::rdmaRead;
    q->wr_rdma_write = QpExOps::rdmaWrite;
    q->wr_rdma_write_imm = QpExOps::rdmaWriteImm;
    q->wr_send = QpExOps::send;
    q->wr_send_imm = QpExOps::sendImm;
    q->wr_send_inv = QpExOps::sendInv;
    q->wr_send_tso = QpExOps::sendTso;
    q->wr_set_ud_addr = QpExOps::setUdAddr;
    q->wr_set_xrc_srqn = QpExOps::setXrcSrqn;
    q->wr_set_inline_data = QpExOps::setInline;
    q->wr_set_inline_data_list = QpExOps::setInlineList;
    q->wr_set_sge = QpExOps::setSge;
    q->wr_set_sge_list = QpExOps::setSgeList;
    q->wr_start = QpExOps::start;
    q->wr_complete = QpExOps::complete;
    q->wr_abort = QpExOps::abort;
}

}  // namespace tensorlane::simhca
