// tl_last_error: each thread's text of its last failed call, and the helpers that set it with
// the code they return.
#pragma once

#include <string>

#include "tensorlane/ipc/status.hpp"
#include "tensorlane/tensorlane.h"

namespace tensorlane::shim {

using ipc::Code;

/// Sets this thread's tl_last_error and returns the code as a tl_status.
tl_status fail(Code code, std::string message);
/// This thread's tl_last_error text, and setting it back (around calls whose failure is not
/// the caller's).
std::string lastErrorText();
void setLastErrorText(std::string text);
/// This thread's tl_last_error, for the C ABI.
const char *lastError();
inline tl_status toStatus(Code c) {
    return static_cast<tl_status>(c);
}

}  // namespace tensorlane::shim
