# The sidecar's CUDA layer (contexts, IPC imports, copies, tcp staging), added to
# tensorlane_sidecar_core; the driver table is tensorlane::cuda's (cuda/). Without cuda.h they
# build as stubs.
set(TENSORLANE_CUDA_SOURCES
  src/cuda/runtime.cpp
  src/cuda/import.cpp
  src/cuda/import_checker.cpp
  src/cuda/copier.cpp
  src/cuda/stager.cpp
)
