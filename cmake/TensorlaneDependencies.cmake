# Every dependency comes from Debian packages (see scripts/install-deps.sh).
find_package(PkgConfig REQUIRED)
pkg_check_modules(IBVERBS REQUIRED IMPORTED_TARGET libibverbs)
pkg_check_modules(SODIUM REQUIRED IMPORTED_TARGET libsodium)
# OpenSSL's libcrypto: its Poly1305 (vectorised) for the tcp frame tags (net/frame_auth.hpp).
find_package(OpenSSL 3.0 REQUIRED COMPONENTS Crypto)
find_package(Threads REQUIRED)
find_package(Boost 1.74 REQUIRED)
find_package(tomlplusplus REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
# The Prometheus endpoint: prometheus-cpp 1.0 (Debian's prometheus-cpp-dev; civetweb inside).
find_package(prometheus-cpp CONFIG REQUIRED)  # the package ships no version file
# The etcd directory's HTTP client (docs/directory.md): Debian's libcurl4-openssl-dev.
find_package(CURL 7.68 REQUIRED)  # curl_multi_wakeup/curl_multi_poll

# CUDA: headers from the toolkit; the driver library is opened at run time (dlopen), so the
# binaries run on machines with no GPU or driver and say so clearly. Nothing links libcuda or
# libcudart.
find_package(CUDAToolkit QUIET)
if(CUDAToolkit_FOUND)
  message(STATUS "tensorlane: CUDA toolkit ${CUDAToolkit_VERSION} found, building with CUDA support")
  set(TENSORLANE_HAVE_CUDA ON)
else()
  message(STATUS "tensorlane: CUDA toolkit not found, building without CUDA support")
  set(TENSORLANE_HAVE_CUDA OFF)
endif()

# Dependency headers are system headers (-isystem), so a newer compiler's warnings in them are
# not ours: imported targets (spdlog, fmt, toml++, nlohmann-json, CLI11, GTest, benchmark,
# pkg-config's libibverbs and libsodium) are SYSTEM by default, and CUDA's headers are added
# with SYSTEM here. (-Werror stays on for CI and the dev presets; TensorlaneWarnings.cmake.)
function(tensorlane_use_cuda_headers target)
  if(TENSORLANE_HAVE_CUDA)
    target_compile_definitions(${target} PRIVATE TENSORLANE_HAVE_CUDA=1)
    target_include_directories(${target} SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  endif()
endfunction()
