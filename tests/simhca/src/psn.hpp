// 24-bit PSN arithmetic (IB spec 9.7.1: PSNs wrap modulo 2^24; half the space is "ahead").
#pragma once

#include <cstdint>

#include "headers.hpp"

namespace tensorlane::simhca {

/// a - b as a signed distance in the 24-bit PSN space (positive: a is after b).
[[nodiscard]] constexpr int32_t psnDiff(uint32_t a, uint32_t b) {
    return static_cast<int32_t>((a - b) << 8) >> 8;
}

/// psn + n modulo 2^24.
[[nodiscard]] constexpr uint32_t psnAdd(uint32_t psn, uint32_t n) {
    return (psn + n) & kPsnMask;
}

}  // namespace tensorlane::simhca
