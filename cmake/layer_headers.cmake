# SPDX-License-Identifier: Apache-2.0
# Private headers stay private to their layer and the layers above it.
#
# Sources include a layer's private headers by layer-qualified path ("io/engine_internal.h").
# Putting all of src/ on the include path would let any layer include any other layer's
# headers, so instead each layer gets its own include root in the build tree, holding only a
# link to its own folder:
#
#   <build>/layer-include/io/io -> <source>/src/io
#
# fastpersist_layer_headers(fastpersist_io io) adds that root to the layer's library as a
# PUBLIC, build-only include directory. A layer therefore sees its own headers and, through
# target_link_libraries, those of the layers it links (the ones below it); a header of a layer
# above it (io including "checkpoint/save_job.h") is not found and the build fails. Nothing
# under src/ reaches an installed package (BUILD_INTERFACE only). tests/cpp/CMakeLists.txt
# checks both directions (see cmake/layer_include_checks.cmake).
#
# A link, not a copy: new headers need no CMake change, and errors and debuggers point into
# src/ (compilers report the path as included; it resolves to the source file).

function(fastpersist_layer_headers target layer)
  set(layer_dir "${PROJECT_SOURCE_DIR}/src/${layer}")
  if(NOT IS_DIRECTORY "${layer_dir}")
    message(FATAL_ERROR "fastpersist_layer_headers: no folder src/${layer}")
  endif()
  set(root "${PROJECT_BINARY_DIR}/layer-include/${layer}")
  file(MAKE_DIRECTORY "${root}")
  set(link "${root}/${layer}")
  if(IS_SYMLINK "${link}")
    file(READ_SYMLINK "${link}" link_target)
    if(NOT link_target STREQUAL layer_dir)  # the source tree moved
      file(REMOVE "${link}")
    endif()
  endif()
  if(NOT IS_SYMLINK "${link}")
    file(CREATE_LINK "${layer_dir}" "${link}" SYMBOLIC)
  endif()
  target_include_directories(${target} PUBLIC "$<BUILD_INTERFACE:${root}>")
endfunction()
