// What each fd in the engine's epoll set is: a tag in epoll_event.data, the kind in the top byte
// and an id below (a session's, or a transport's index and fd). The engine's loop dispatches on
// it (engine.cpp); the control server adds the fds of the client socket and of each session.
#pragma once

#include <cstdint>

namespace tensorlane::sidecar {

enum EpollTag : uint64_t {
    kTagListen = 1ull << 56,      ///< the client socket (control server)
    kTagStop = 2ull << 56,        ///< Engine::stop()'s eventfd
    kTagPeers = 4ull << 56,       ///< the peer layer's epoll fd
    kTagSock = 5ull << 56,        ///< a session's socket (bits 0-55: its id)
    kTagBell = 6ull << 56,        ///< a session's to_sidecar doorbell (bits 0-55: its id)
    kTagTransport = 7ull << 56,   ///< a transport's fd (bits 32-55: its index, 0-31: the fd)
    kTagMetrics = 8ull << 56,     ///< a scrape waits for a snapshot
    kTagCudaCheck = 9ull << 56,   ///< CUDA imports verified (cuda_registrar.hpp)
    kTagDirectory = 10ull << 56,  ///< the cluster directory's events (cluster_directory.hpp)
};
inline constexpr uint64_t kTagMask = 0xffull << 56;

/// epoll_ctl(EPOLL_CTL_ADD) of `fd` with `tag` as its data; 0 or errno.
int addToEpoll(int epfd, int fd, uint32_t events, uint64_t tag);

}  // namespace tensorlane::sidecar
