// The verbs objects handed to applications are plain rdma-core structs; each is the first member
// of a standard-layout handle that also points back at the simulator's object, so a pointer the
// application passes in converts back without a lookup (the way rdma-core providers embed
// ibv_qp in their own QP struct, without offsetof on non-standard-layout classes).
#pragma once

#include <infiniband/verbs.h>

#include <type_traits>

namespace tensorlane::simhca {

class SimDevice;
class SimContext;
class SimPd;
class SimCq;
class SimQp;
class MemoryRegion;
class CompChannel;

/// Wraps ibv_device.
struct DeviceHandle {
    ibv_device ibv;   ///< what the application holds (first member)
    SimDevice *self;  ///< the simulator's object
};
/// Wraps verbs_context; applications see &vctx.context.
struct ContextHandle {
    verbs_context vctx;  ///< what the application holds (first member)
    SimContext *self;    ///< the simulator's object
};
/// Wraps ibv_pd.
struct PdHandle {
    ibv_pd ibv;   ///< what the application holds (first member)
    SimPd *self;  ///< the simulator's object
};
/// Wraps ibv_cq_ex, whose leading fields are those of ibv_cq (verbs.h: "ibv_cq_ex ... must
/// be binary compatible with ibv_cq").
struct CqHandle {
    ibv_cq_ex ibv;  ///< what the application holds (first member)
    SimCq *self;    ///< the simulator's object
};
/// Wraps ibv_qp_ex; ibv_qp is its first member.
struct QpHandle {
    ibv_qp_ex ibv;  ///< what the application holds (first member)
    SimQp *self;    ///< the simulator's object
};
/// Wraps ibv_mr.
struct MrHandle {
    ibv_mr ibv;          ///< what the application holds (first member)
    MemoryRegion *self;  ///< the simulator's object
};
/// Wraps ibv_comp_channel.
struct ChannelHandle {
    ibv_comp_channel ibv;  ///< what the application holds (first member)
    CompChannel *self;     ///< the simulator's object
};

static_assert(std::is_standard_layout_v<DeviceHandle> && std::is_standard_layout_v<QpHandle> &&
              std::is_standard_layout_v<CqHandle> && std::is_standard_layout_v<ContextHandle>);

/// The handle whose first member p is.
template <typename Handle, typename T>
[[nodiscard]] Handle *handleOf(T *p) {
    return reinterpret_cast<Handle *>(p);
}

}  // namespace tensorlane::simhca
