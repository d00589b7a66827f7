// spdlog (and the fmt it brings), as the sidecar's files include it: through here, first.
//
// GCC 13 at -O2 (Ubuntu 24.04's, with fmt 9) reports -Warray-bounds, and once that is silenced
// -Wstringop-overflow, inside fmt's own headers (fmt::detail::format_dragon ->
// basic_memory_buffer::grow -> std::uninitialized_copy, seen on the GPU machine): false
// positives in code that lies wholly in fmt's and libstdc++'s headers. They are system headers,
// but GCC still reports a middle-end warning about such code once it is inlined into a function
// it emits in our translation unit; what it honours along the inlining stack is a diagnostic
// pragma around the header text. So: only those two, only over fmt's and spdlog's text (the
// first inclusion of fmt in the translation unit comes through here); our code keeps them all.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#endif
#include <spdlog/logger.h>
#include <spdlog/spdlog.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
