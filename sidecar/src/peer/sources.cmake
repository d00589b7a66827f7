# Sources of the peer subsystem (bootstrap, descriptors), added to tensorlane_sidecar_core.
set(TENSORLANE_PEER_SOURCES
  src/peer/address.cpp
  src/peer/dialer.cpp
  src/peer/directory.cpp
  src/peer/handshake.cpp
  src/peer/key.cpp
  src/peer/listener.cpp
  src/peer/liveness.cpp
  src/peer/log.cpp
  src/peer/manager.cpp
  src/peer/peer_table.cpp
  src/peer/resolver.cpp
  src/peer/wire.cpp
)
