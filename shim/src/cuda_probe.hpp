// Tells CUDA device pointers from host pointers without linking the CUDA driver: libcuda is
// opened at run time, so the shim loads on machines with no GPU or driver.
#pragma once

namespace tensorlane::shim {

enum class PointerKind { kHost, kCudaDevice, kUnknown };

/// kCudaDevice when the CUDA driver is present and says `ptr` is device (or managed) memory.
PointerKind probePointer(const void *ptr);

}  // namespace tensorlane::shim
