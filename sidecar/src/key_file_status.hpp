// A peer key file as the sidecar reports it: config::readKeyFile's result as a Status whose
// message names the file. Shared by the peer layer (peer/key.cpp derives its MAC key from the
// bytes) and the start checks (fabric/startup.cpp only asks whether the file would be taken),
// so the two refuse the same files in the same words, and fabric/ needs nothing from peer/.
#pragma once

#include <string>

#include "tensorlane/config/key_file.hpp"
#include "tensorlane/sidecar/status.hpp"

namespace tensorlane::sidecar {

/// kPermission for a file that cannot be used as it is (missing, unreadable, open to others),
/// kInvalid for content that is not a tensorlane-key-v1 line.
inline Code keyFileCode(const config::KeyFileResult &r) {
    return r.problem == config::KeyFileResult::Problem::kAccess ? Code::kPermission
                                                                : Code::kInvalid;
}

/// Reads the key file at `path` into `bytes` (config::readKeyFile). On failure the message is
/// "peer key file <path>: <what is wrong and how to fix it>".
inline Status readPeerKeyFile(const std::string &path, config::KeyBytes *bytes) {
    const config::KeyFileResult r = config::readKeyFile(path, bytes);
    if (r.ok()) {
        return Status::ok();
    }
    return {keyFileCode(r), "peer key file " + path + ": " + r.detail};
}

}  // namespace tensorlane::sidecar
