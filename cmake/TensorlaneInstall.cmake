# `cmake --install`: where a distribution puts each part (GNUInstallDirs), docs/deploy.md.
#
#   bin/                              tensorlane-sidecar, tensorlane, tensorlane-example-exchange
#   lib/<multiarch>/                  libtensorlane.so.0.1.0, .so.0 (soname), .so (development)
#   lib/<multiarch>/pkgconfig/        tensorlane.pc
#   lib/<multiarch>/cmake/tensorlane/ find_package(tensorlane) -> tensorlane::shim
#   include/tensorlane/               tensorlane.h (C ABI), tensorlane.hpp (C++ wrapper)
#   lib/systemd/system/               tensorlane-sidecar.service
#   lib/sysusers.d/                   tensorlane.conf (the tensorlane group)
#   share/doc/tensorlane/             deploy.md, peers.md, metrics.md, examples/*.toml, kubernetes/*.yaml
#   lib/python3.X/dist-packages/      the Python package (lib/python3/dist-packages for /usr)
#
# Nothing is written to etc/: /etc/tensorlane/sidecar.toml and peer.key are the operator's
# (copy an example, run `tensorlane keygen`). The unit and tensorlane.pc are generated at install
# time, so they name the prefix actually installed to (`cmake --install --prefix DIR` included);
# DESTDIR staging is honoured as usual. Packagers who want no RPATH on the binaries set
# CMAKE_SKIP_INSTALL_RPATH=ON.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Relative paths are under the prefix. systemd reads units from /usr/lib/systemd/system and
# /usr/local/lib/systemd/system (systemd.unit(5)), so lib/ here, never the multiarch libdir.
set(TENSORLANE_INSTALL_SYSTEMDUNITDIR "lib/systemd/system" CACHE STRING
    "Where tensorlane-sidecar.service goes (relative: under the prefix)")
set(TENSORLANE_INSTALL_SYSUSERSDIR "lib/sysusers.d" CACHE STRING
    "Where the tensorlane group's sysusers.d file goes (relative: under the prefix)")
# The Python package (shim/python): Debian's python3 reads /usr/lib/python3/dist-packages (a
# package's place) and /usr/local/lib/python3.X/dist-packages (an administrator's).
# `pip install ./shim/python` is the other way (docs/python.md).
find_package(Python3 COMPONENTS Interpreter QUIET)
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr" OR NOT Python3_FOUND)
  set(_tl_python_dir "lib/python3/dist-packages")
else()
  set(_tl_python_dir "lib/python${Python3_VERSION_MAJOR}.${Python3_VERSION_MINOR}/dist-packages")
endif()
set(TENSORLANE_INSTALL_PYTHONDIR "${_tl_python_dir}" CACHE STRING
    "Where the tensorlane Python package goes (relative: under the prefix)")

# Binaries. The CLI and the example link the shim: find it relative to themselves.
install(TARGETS tensorlane-sidecar tensorlane tensorlane-example-exchange
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
if(NOT IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" AND NOT IS_ABSOLUTE "${CMAKE_INSTALL_BINDIR}")
  file(RELATIVE_PATH _tl_bin_to_lib "/${CMAKE_INSTALL_BINDIR}" "/${CMAKE_INSTALL_LIBDIR}")
  set_target_properties(tensorlane tensorlane-example-exchange PROPERTIES
                        INSTALL_RPATH "$ORIGIN/${_tl_bin_to_lib}")
endif()

# The shim: libtensorlane.so.<version> with its soname link (runtime) and the unversioned
# link for linking against it (dev), its two headers, pkg-config and CMake package files.
set_target_properties(tensorlane_shim PROPERTIES EXPORT_NAME shim)
install(TARGETS tensorlane_shim EXPORT TensorlaneTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The NCCL net plugin beside it (NCCL_NET_PLUGIN=tensorlane finds it on the loader path).
install(TARGETS nccl_net_tensorlane LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime)
install(FILES ${PROJECT_SOURCE_DIR}/shim/include/tensorlane/tensorlane.h
              ${PROJECT_SOURCE_DIR}/shim/include/tensorlane/tensorlane.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tensorlane COMPONENT dev)
install(EXPORT TensorlaneTargets NAMESPACE tensorlane::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tensorlane COMPONENT dev)
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/tensorlaneConfig.cmake
     "include(\"\${CMAKE_CURRENT_LIST_DIR}/TensorlaneTargets.cmake\")\n")
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/tensorlaneConfigVersion.cmake
                                 COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/tensorlaneConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/tensorlaneConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tensorlane COMPONENT dev)

# Files that name installed paths are configured when installing, with the prefix of that
# install: absolute GNUInstallDirs values are kept, relative ones put under the prefix.
function(tensorlane_install_configured template output destination component)
  set(_dirs "")
  foreach(_var BINDIR LIBDIR INCLUDEDIR DOCDIR)
    if(IS_ABSOLUTE "${CMAKE_INSTALL_${_var}}")
      string(APPEND _dirs "set(TENSORLANE_${_var} \"${CMAKE_INSTALL_${_var}}\")\n")
    else()
      string(APPEND _dirs
             "set(TENSORLANE_${_var} \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_${_var}}\")\n")
    endif()
  endforeach()
  set(_out "${CMAKE_CURRENT_BINARY_DIR}/install-generated/${output}")
  install(CODE "${_dirs}
set(TENSORLANE_VERSION \"${PROJECT_VERSION}\")
configure_file(\"${template}\" \"${_out}\" @ONLY)" COMPONENT ${component})
  install(FILES "${_out}" DESTINATION ${destination} COMPONENT ${component})
endfunction()

tensorlane_install_configured(${PROJECT_SOURCE_DIR}/scripts/deploy/systemd/tensorlane-sidecar.service.in
                              tensorlane-sidecar.service ${TENSORLANE_INSTALL_SYSTEMDUNITDIR} runtime)
tensorlane_install_configured(${PROJECT_SOURCE_DIR}/cmake/tensorlane.pc.in tensorlane.pc
                              ${CMAKE_INSTALL_LIBDIR}/pkgconfig dev)
install(FILES ${PROJECT_SOURCE_DIR}/scripts/deploy/systemd/tensorlane.sysusers
        DESTINATION ${TENSORLANE_INSTALL_SYSUSERSDIR} RENAME tensorlane.conf COMPONENT runtime)

# Documentation and examples: what an operator copies to /etc/tensorlane and to a cluster.
install(FILES ${PROJECT_SOURCE_DIR}/docs/deploy.md ${PROJECT_SOURCE_DIR}/docs/peers.md
              ${PROJECT_SOURCE_DIR}/docs/metrics.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT runtime)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/config/examples/
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples COMPONENT runtime
        FILES_MATCHING PATTERN "*.toml")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/scripts/deploy/kubernetes/
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/kubernetes COMPONENT runtime
        FILES_MATCHING PATTERN "*.yaml")

# The Python package: pure Python; it finds the installed libtensorlane.so.0 through the
# install's record, tensorlane/_installed.py (the library directory of this install, --prefix
# included), else the dynamic loader (ldconfig) or $TENSORLANE_LIBRARY (tensorlane/_lib.py).
if(EXISTS ${PROJECT_SOURCE_DIR}/shim/python/tensorlane/__init__.py)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/shim/python/tensorlane
          DESTINATION ${TENSORLANE_INSTALL_PYTHONDIR} COMPONENT python
          PATTERN "__pycache__" EXCLUDE)
  tensorlane_install_configured(${PROJECT_SOURCE_DIR}/cmake/_installed.py.in _installed.py
                                ${TENSORLANE_INSTALL_PYTHONDIR}/tensorlane python)
endif()
