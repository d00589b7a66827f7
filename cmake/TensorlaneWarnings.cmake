# Warnings and sanitizers, applied to every target of the project through one interface target.
add_library(tensorlane_build_flags INTERFACE)
add_library(tensorlane::build_flags ALIAS tensorlane_build_flags)
target_compile_options(tensorlane_build_flags INTERFACE -Wall -Wextra -Wshadow -Wnon-virtual-dtor
                                                        -Wno-missing-field-initializers)
# GCC 12 at -O3 reports -Wrestrict inside libstdc++'s std::string operator+ (GCC bug 105329, a
# false positive fixed in GCC 13); it would otherwise fail the release preset.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  target_compile_options(tensorlane_build_flags INTERFACE -Wno-restrict)
endif()
# Unity builds (CMAKE_UNITY_BUILD, on in every preset but dev): GCC takes a test fixture in one
# .cpp file's anonymous namespace, included into a unity source, for a header's type used as a
# base (-Wsubobject-linkage); it is still one file's, and the dev preset builds each file alone.
if(CMAKE_UNITY_BUILD AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  target_compile_options(tensorlane_build_flags INTERFACE -Wno-subobject-linkage)
endif()
# -Werror: on in the dev, asan, tsan and fuzz presets and in CI (scripts/test.sh passes it to the
# release preset); off in a plain `cmake --preset release`, so that a compiler newer than ours
# warning about a dependency's headers never stops a user's release build.
if(TENSORLANE_WERROR)
  target_compile_options(tensorlane_build_flags INTERFACE -Werror)
endif()

if(TENSORLANE_SANITIZE STREQUAL "address")
  target_compile_options(tensorlane_build_flags INTERFACE -fsanitize=address,undefined
                                                          -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  target_link_options(tensorlane_build_flags INTERFACE -fsanitize=address,undefined)
elseif(TENSORLANE_SANITIZE STREQUAL "thread")
  target_compile_options(tensorlane_build_flags INTERFACE -fsanitize=thread -fno-omit-frame-pointer)
  # GCC warns that TSan does not model atomic_thread_fence. The doorbell protocol's Dekker fences
  # are checked by the cross-process tests instead; the rings use no fences.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(tensorlane_build_flags INTERFACE -Wno-tsan)
  endif()
  target_link_options(tensorlane_build_flags INTERFACE -fsanitize=thread)
elseif(NOT TENSORLANE_SANITIZE STREQUAL "")
  message(FATAL_ERROR "TENSORLANE_SANITIZE must be empty, address or thread")
endif()
