# The sidecar's CUDA layer (driver table, contexts, IPC imports, copies, tcp staging), added to
# tensorlane_sidecar_core. driver.cpp needs cuda.h; the others build without it as stubs.
set(TENSORLANE_CUDA_SOURCES
  src/cuda/runtime.cpp
  src/cuda/import.cpp
  src/cuda/import_checker.cpp
  src/cuda/copier.cpp
  src/cuda/stager.cpp
)
if(TENSORLANE_HAVE_CUDA)
  list(APPEND TENSORLANE_CUDA_SOURCES src/cuda/driver.cpp)
endif()
