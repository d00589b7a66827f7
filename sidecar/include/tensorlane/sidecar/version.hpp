// What `tensorlane-sidecar --version` and `tensorlane --version` print.
#pragma once

#include <string>

namespace tensorlane::sidecar {

/// Several lines: `program` and the release with the source commit, the wire protocol versions
/// (peer, each transport's, the client's control messages and ring segments: a peer or client
/// of another version is refused, naming both), and the optional parts built in.
std::string versionText(const std::string &program);

}  // namespace tensorlane::sidecar
