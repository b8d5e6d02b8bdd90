# SPDX-License-Identifier: Apache-2.0
# Third-party libraries. Each optional one switches a backend on or off; the build records which,
# so `fastpersist report` can say "not built in" and how to fix it.
find_package(Threads REQUIRED)
find_package(PkgConfig)

set(FASTPERSIST_HAVE_URING OFF)
if(FASTPERSIST_WITH_URING AND PkgConfig_FOUND)
  pkg_check_modules(URING IMPORTED_TARGET liburing>=2.0)
  if(URING_FOUND)
    set(FASTPERSIST_HAVE_URING ON)
  endif()
endif()

set(FASTPERSIST_HAVE_AIO OFF)
if(FASTPERSIST_WITH_AIO)
  find_path(AIO_INCLUDE_DIR libaio.h)
  find_library(AIO_LIBRARY aio)
  if(AIO_INCLUDE_DIR AND AIO_LIBRARY)
    set(FASTPERSIST_HAVE_AIO ON)
    add_library(fastpersist_libaio UNKNOWN IMPORTED)
    set_target_properties(fastpersist_libaio PROPERTIES IMPORTED_LOCATION "${AIO_LIBRARY}"
                          INTERFACE_INCLUDE_DIRECTORIES "${AIO_INCLUDE_DIR}")
  endif()
endif()

# xxHash: stream digests and (later) checkpoint checksums. Required.
find_path(XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
find_library(XXHASH_LIBRARY xxhash REQUIRED)
add_library(fastpersist_xxhash UNKNOWN IMPORTED)
set_target_properties(fastpersist_xxhash PROPERTIES IMPORTED_LOCATION "${XXHASH_LIBRARY}"
                      INTERFACE_INCLUDE_DIRECTORIES "${XXHASH_INCLUDE_DIR}")
# xxHash's x86 builds (Debian's among them) also export XXH3_*_dispatch: the same hashes with
# the widest vector unit the CPU has, chosen at run time (AVX2, AVX-512), about twice the
# default SSE2 speed here. Used when the library has them (checksum.cc, parallel_commit.cc).
include(CheckCXXSourceCompiles)
set(CMAKE_REQUIRED_INCLUDES "${XXHASH_INCLUDE_DIR}")
set(CMAKE_REQUIRED_LIBRARIES "${XXHASH_LIBRARY}")
check_cxx_source_compiles([=[
#include <xxhash.h>
#include <xxh_x86dispatch.h>
int main() { return static_cast<int>(XXH3_64bits_dispatch("", 0) & 1) + static_cast<int>(XXH3_128bits_dispatch("", 0).low64 & 1); }
]=] FASTPERSIST_XXH_DISPATCH)
unset(CMAKE_REQUIRED_INCLUDES)
unset(CMAKE_REQUIRED_LIBRARIES)
if(FASTPERSIST_XXH_DISPATCH)
  set_property(TARGET fastpersist_xxhash APPEND PROPERTY INTERFACE_COMPILE_DEFINITIONS FASTPERSIST_XXH_DISPATCH=1)
endif()

# zstd and lz4: compressed tensor encodings (format/tensor_codec.cc). Required: a build that
# cannot read a compressed checkpoint would refuse checkpoints other builds wrote.
if(NOT PkgConfig_FOUND)
  message(FATAL_ERROR "pkg-config is needed to find libzstd and liblz4 (apt install pkg-config)")
endif()
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd>=1.4.0)
pkg_check_modules(LZ4 REQUIRED IMPORTED_TARGET liblz4>=1.9.0)

# nlohmann-json: checkpoint manifests and safetensors headers (and the CLI's --json output).
find_package(nlohmann_json 3.10 REQUIRED)
# CLI11: the CLI, and the fuzz target of its numeric flags (tests/fuzz).
if(FASTPERSIST_BUILD_TOOLS OR FASTPERSIST_BUILD_TESTS OR FASTPERSIST_FUZZ)
  find_package(CLI11 REQUIRED)
endif()
if(FASTPERSIST_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()

message(STATUS "fastpersist: io_uring backend ${FASTPERSIST_HAVE_URING}, libaio backend ${FASTPERSIST_HAVE_AIO}")
