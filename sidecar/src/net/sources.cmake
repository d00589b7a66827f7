# Sources of the framed peer connections (bootstrap and tcp data), added to tensorlane_sidecar_core.
set(TENSORLANE_NET_SOURCES
  src/net/connection.cpp
  src/net/cpus.cpp
  src/net/frame_auth.cpp
  src/net/socket.cpp
  src/net/tag_pool.cpp
)
