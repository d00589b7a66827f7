# Sources of the cluster directory (membership in etcd, docs/directory.md), added to
# tensorlane_sidecar_core.
set(TENSORLANE_CLUSTER_SOURCES
  src/cluster/etcd_client.cpp
  src/cluster/membership.cpp
  src/cluster/node_record.cpp
)
