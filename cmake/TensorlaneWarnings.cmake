# Warnings and sanitizers, applied to every target of the project through one interface target.
add_library(tensorlane_build_flags INTERFACE)
add_library(tensorlane::build_flags ALIAS tensorlane_build_flags)
target_compile_options(tensorlane_build_flags INTERFACE -Wall -Wextra -Wshadow -Wnon-virtual-dtor
                                                        -Wno-missing-field-initializers)
if(TENSORLANE_WERROR)
  target_compile_options(tensorlane_build_flags INTERFACE -Werror)
endif()

if(TENSORLANE_SANITIZE STREQUAL "address")
  target_compile_options(tensorlane_build_flags INTERFACE -fsanitize=address,undefined
                                                          -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  target_link_options(tensorlane_build_flags INTERFACE -fsanitize=address,undefined)
elseif(TENSORLANE_SANITIZE STREQUAL "thread")
  target_compile_options(tensorlane_build_flags INTERFACE -fsanitize=thread -fno-omit-frame-pointer)
  target_link_options(tensorlane_build_flags INTERFACE -fsanitize=thread)
elseif(NOT TENSORLANE_SANITIZE STREQUAL "")
  message(FATAL_ERROR "TENSORLANE_SANITIZE must be empty, address or thread")
endif()
