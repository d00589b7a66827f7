#include "last_error.hpp"

namespace tensorlane::shim {
namespace {

thread_local std::string t_last_error;

}  // namespace

const char *lastError() {
    return t_last_error.c_str();
}

tl_status fail(Code code, std::string message) {
    t_last_error = std::move(message);
    return toStatus(code);
}

std::string lastErrorText() {
    return t_last_error;
}

void setLastErrorText(std::string text) {
    t_last_error = std::move(text);
}

}  // namespace tensorlane::shim
