#include "tensorlane/sidecar/version.hpp"

#include "peer/wire.hpp"
#include "tensorlane/ipc/control.hpp"
#include "tensorlane/ipc/layout.hpp"
#include "tensorlane_git_commit.h"  // generated at build time (cmake/GitCommit.cmake)
#include "transport/tcp/tcp_transport.hpp"
#include "transport/verbs/wire.hpp"

#ifndef TENSORLANE_VERSION_STRING
#define TENSORLANE_VERSION_STRING "unknown"
#endif

namespace tensorlane::sidecar {

std::string versionText(const std::string &program) {
    std::string out =
        program + " " + TENSORLANE_VERSION_STRING + " (commit " + TENSORLANE_GIT_COMMIT + ")\n";
    out += "wire protocols: peer " + std::to_string(kPeerProtocolVersion) + ", tcp transport " +
           std::to_string(kTcpBlobVersion) + ", verbs transport " +
           std::to_string(kVerbsWireVersion) + ", client control " +
           std::to_string(ipc::kControlVersion) + ", ring segments " +
           std::to_string(ipc::kLayoutVersion) + "\n";
    out += "built with: verbs (rdma-core's libibverbs), tcp, local";
#if TENSORLANE_HAVE_CUDA
    out += ", CUDA (the driver is loaded at run time)";
#else
    out += "; without CUDA";
#endif
    out += ", Prometheus metrics (prometheus-cpp)";
#ifdef TENSORLANE_SANITIZER_BUILD
    out += ", instrumented (" TENSORLANE_SANITIZER_BUILD ")";
#endif
    return out;  // CLI11 ends the line
}

}  // namespace tensorlane::sidecar
