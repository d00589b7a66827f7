// A protection domain: only identity matters to the simulator (keys and QPs must share it).
#pragma once

#include "handles.hpp"

namespace tensorlane::simhca {

/// One PD.
class SimPd {
public:
    /// A PD of ctx.
    explicit SimPd(ibv_context *ctx) {
        handle_.self = this;
        handle_.ibv.context = ctx;
        handle_.ibv.handle = 0;
    }
    /// What the application holds.
    [[nodiscard]] ibv_pd *ibv() { return &handle_.ibv; }
    /// The PD behind an ibv_pd this library handed out.
    [[nodiscard]] static SimPd *from(ibv_pd *pd) { return handleOf<PdHandle>(pd)->self; }

private:
    PdHandle handle_{};
};

}  // namespace tensorlane::simhca
