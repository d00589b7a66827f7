# Sources of fabric discovery and `tensorlane diag` (sysfs only, no libibverbs), added to
# tensorlane_sidecar_core.
set(TENSORLANE_FABRIC_SOURCES
  src/fabric/command.cpp
  src/fabric/diag.cpp
  src/fabric/diag_checks.cpp
  src/fabric/diag_format.cpp
  src/fabric/gid.cpp
  src/fabric/log.cpp
  src/fabric/qos.cpp
  src/fabric/select.cpp
  src/fabric/startup.cpp
  src/fabric/topology.cpp
)
