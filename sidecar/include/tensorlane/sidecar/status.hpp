// Status inside the sidecar: a code (the wire's) and a reason for the log and the client.
#pragma once

#include <string>
#include <utility>

#include "tensorlane/ipc/status.hpp"

namespace tensorlane::sidecar {

using ipc::Code;

/// A result code with a human reason. Cheap when ok.
class [[nodiscard]] Status {
public:
    Status() = default;
    Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
    static Status ok() { return {}; }

    bool isOk() const { return code_ == Code::kOk; }
    Code code() const { return code_; }
    const std::string &message() const { return message_; }

private:
    Code code_ = Code::kOk;
    std::string message_;
};

}  // namespace tensorlane::sidecar
