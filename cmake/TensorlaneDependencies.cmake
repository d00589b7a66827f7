# Every dependency comes from Debian packages (see scripts/install-deps.sh).
find_package(PkgConfig REQUIRED)
pkg_check_modules(IBVERBS REQUIRED IMPORTED_TARGET libibverbs)
pkg_check_modules(SODIUM REQUIRED IMPORTED_TARGET libsodium)
find_package(Threads REQUIRED)
find_package(Boost 1.74 REQUIRED)
find_package(tomlplusplus REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
# The Prometheus endpoint: prometheus-cpp 1.0 (Debian's prometheus-cpp-dev; civetweb inside).
find_package(prometheus-cpp CONFIG REQUIRED)  # the package ships no version file

# CUDA: headers from the toolkit; the driver library is opened at run time (dlopen), so the
# binaries run on machines with no GPU or driver and say so clearly.
find_package(CUDAToolkit QUIET)
if(CUDAToolkit_FOUND)
  message(STATUS "tensorlane: CUDA toolkit ${CUDAToolkit_VERSION} found, building with CUDA support")
  set(TENSORLANE_HAVE_CUDA ON)
else()
  message(STATUS "tensorlane: CUDA toolkit not found, building without CUDA support")
  set(TENSORLANE_HAVE_CUDA OFF)
endif()
