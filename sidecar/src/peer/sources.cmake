# Sources of the peer subsystem (bootstrap, descriptors), added to tensorlane_sidecar_core.
set(TENSORLANE_PEER_SOURCES
)
