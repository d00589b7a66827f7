# Sources of the local transport, added to tensorlane_sidecar_core.
set(TENSORLANE_LOCAL_SOURCES
  src/transport/local/copy_thread.cpp
  src/transport/local/engine_gpu_copies.cpp
  src/transport/local/gpu_copy.cpp
  src/transport/local/host_copy.cpp
  src/transport/local/inline_host_copies.cpp
  src/transport/local/local_job.cpp
  src/transport/local/local_transport.cpp
)
