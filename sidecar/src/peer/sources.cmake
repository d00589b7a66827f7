# Sources of the peer subsystem (bootstrap, descriptors), added to tensorlane_sidecar_core.
set(TENSORLANE_PEER_SOURCES
  src/peer/address.cpp
  src/peer/directory.cpp
  src/peer/handshake.cpp
  src/peer/inbound.cpp
  src/peer/key.cpp
  src/peer/liveness.cpp
  src/peer/log.cpp
  src/peer/manager.cpp
  src/peer/outbound.cpp
  src/peer/resolver.cpp
  src/peer/wire.cpp
)
