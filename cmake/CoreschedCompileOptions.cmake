# Warnings and sanitizers for every coresched target, through one interface target.
add_library(coresched_compile_options INTERFACE)
target_compile_options(coresched_compile_options INTERFACE -Wall -Wextra -Wpedantic -Wshadow -Wconversion
                                                           -Wno-sign-conversion
                                                           -Wno-missing-field-initializers)
if(CORESCHED_WERROR)
  target_compile_options(coresched_compile_options INTERFACE -Werror)
endif()

if(CORESCHED_SANITIZE STREQUAL "address")
  set(_san -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
elseif(CORESCHED_SANITIZE STREQUAL "thread")
  set(_san -fsanitize=thread -fno-omit-frame-pointer)
elseif(NOT CORESCHED_SANITIZE STREQUAL "")
  message(FATAL_ERROR "CORESCHED_SANITIZE must be '', 'address' or 'thread' (got '${CORESCHED_SANITIZE}')")
endif()
if(_san)
  # Applied globally so test and benchmark code is instrumented too.
  add_compile_options(${_san})
  add_link_options(${_san})
  # -O1 with line tables only (after the build type's -O2 -g, so they win):
  # instrumented code at -O2 with full debug information took twice as long
  # to compile, and two sanitizer builds dominated CI's time on two CPUs.
  # Reports keep their file:line frames.
  add_compile_options(-O1 -g1)
endif()
