# Sources of the TCP transport, added to tensorlane_sidecar_core.
set(TENSORLANE_TCP_SOURCES
  src/transport/tcp/links.cpp
  src/transport/tcp/tcp_transport.cpp
  src/transport/tcp/staging.cpp
)
