# SPDX-License-Identifier: Apache-2.0
# ctest check (layering.tools_use_public_headers): the command-line tool is built on the public
# API (include/fastpersist/) and on the few private helpers that exist for it, never on the
# library's internals. Run as `cmake -DSOURCE_DIR=<source> -P tools_include_check.cmake`; fails
# naming each include of a private header of src/ that is not on the list below.
#
# The helpers on the list are the CLI's own (docs/design.md, "The command-line tool"): they
# present paths and progress, and the Python bindings use them too, but they are no API.
set(allowed
  "checkpoint/path_kind.h"  # what a path is (root, checkpoint, torch file, ...), for messages
  "common/progress.h"       # the progress bar and the redrawn status line
  "stream/stale_files.h"    # `fastpersist clean`: temporaries that crashed writers left
)
file(GLOB layer_dirs LIST_DIRECTORIES true RELATIVE "${SOURCE_DIR}/src" "${SOURCE_DIR}/src/*")
file(GLOB_RECURSE sources "${SOURCE_DIR}/tools/*.cc" "${SOURCE_DIR}/tools/*.h")
set(problems "")
foreach(source ${sources})
  file(STRINGS "${source}" includes REGEX "^#include \"[^\"]+\"")
  foreach(line ${includes})
    string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" header "${line}")
    string(REGEX MATCH "^[^/]+" first "${header}")
    if(header MATCHES "/" AND first IN_LIST layer_dirs AND NOT header IN_LIST allowed)
      file(RELATIVE_PATH where "${SOURCE_DIR}" "${source}")
      string(APPEND problems "\n  ${where}: #include \"${header}\"")
    endif()
  endforeach()
endforeach()
if(problems)
  message(FATAL_ERROR "tools/ includes private headers of the library (use include/fastpersist/, "
                      "e.g. fastpersist/maintenance.h):${problems}")
endif()
message(STATUS "tools/ includes only public headers and the CLI helpers")
