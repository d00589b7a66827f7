# Sources of the Prometheus endpoint ([metrics] listen; prometheus-cpp from Debian), added to
# tensorlane_sidecar_core.
set(TENSORLANE_METRICS_SOURCES
  src/metrics/families.cpp
  src/metrics/metrics_server.cpp
  src/metrics/nic_counters.cpp
  src/metrics/snapshot.cpp
  src/metrics/write_clock.cpp
)
