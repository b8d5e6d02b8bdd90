# SPDX-License-Identifier: Apache-2.0
# ctest checks that a layer sees the private headers of the layers it links and does not see
# those of the layers above or beside it (cmake/layer_headers.cmake sets that up).
#
# Each check is an object library, left out of `all`, that compiles one #include with the
# include directories of the layer's library; the test builds it with `cmake --build`. A
# wrong-way include must fail with the compiler's "not found" message for that header (any
# other failure fails the test); a right-way include must build, which also shows that the
# probe itself compiles.
#
# Every check runs the build tool in the build tree, so they take one lock: never two at once.

set(fastpersist_include_probe "${PROJECT_SOURCE_DIR}/tests/cpp/layering/include_probe.cc")

# fastpersist_layer_include_check(<layer> <header> BUILDS|FAILS)
function(fastpersist_layer_include_check layer header expectation)
  string(MAKE_C_IDENTIFIER "${layer}_includes_${header}" id)
  set(probe "fastpersist_include_probe_${id}")
  add_library(${probe} OBJECT EXCLUDE_FROM_ALL "${fastpersist_include_probe}")
  target_link_libraries(${probe} PRIVATE fastpersist_${layer})
  target_compile_definitions(${probe} PRIVATE FASTPERSIST_PROBE_HEADER="${header}")

  set(test "layering.${layer}_includes_${header}")
  add_test(NAME "${test}"
           COMMAND "${CMAKE_COMMAND}" --build "${PROJECT_BINARY_DIR}" --target ${probe})
  set_tests_properties("${test}" PROPERTIES
    LABELS layering RESOURCE_LOCK fastpersist_build_tree TIMEOUT 300)
  if(expectation STREQUAL "FAILS")
    # GCC: "checkpoint/save_job.h: No such file or directory"; Clang: "'...' file not found".
    string(REPLACE "." "\\." header_regex "${header}")
    set_tests_properties("${test}" PROPERTIES PASS_REGULAR_EXPRESSION
      "${header_regex}'?:? (No such file or directory|file not found)")
  elseif(NOT expectation STREQUAL "BUILDS")
    message(FATAL_ERROR "fastpersist_layer_include_check: BUILDS or FAILS, not ${expectation}")
  endif()
endfunction()

# Wrong way: a layer above, or a sibling the layer does not link.
fastpersist_layer_include_check(common io/engine_internal.h FAILS)
fastpersist_layer_include_check(io checkpoint/save_job.h FAILS)
fastpersist_layer_include_check(io stream/writer_files.h FAILS)
fastpersist_layer_include_check(buffer io/engine_internal.h FAILS)
fastpersist_layer_include_check(stream checkpoint/save_job.h FAILS)
fastpersist_layer_include_check(stream format/format_internal.h FAILS)
fastpersist_layer_include_check(format stream/writer_files.h FAILS)
fastpersist_layer_include_check(format checkpoint/save_job.h FAILS)
fastpersist_layer_include_check(checkpoint_dir load/load_plan.h FAILS)
fastpersist_layer_include_check(checkpoint_dir checkpoint/save_job.h FAILS)
fastpersist_layer_include_check(load checkpoint/save_job.h FAILS)
fastpersist_layer_include_check(load write/shard_plan.h FAILS)
fastpersist_layer_include_check(write incremental/incremental.h FAILS)
fastpersist_layer_include_check(write checkpoint/save_job.h FAILS)
fastpersist_layer_include_check(incremental checkpoint/save_job.h FAILS)
fastpersist_layer_include_check(checkpoint tier/tier_drain.h FAILS)
# Right way: the layer's own headers and those of the layers below it.
fastpersist_layer_include_check(io io/engine_internal.h BUILDS)
fastpersist_layer_include_check(checkpoint io/engine_internal.h BUILDS)
fastpersist_layer_include_check(checkpoint stream/writer_files.h BUILDS)
fastpersist_layer_include_check(load checkpoint_dir/checkpoint_fs.h BUILDS)
fastpersist_layer_include_check(checkpoint load/load_plan.h BUILDS)
fastpersist_layer_include_check(write load/delta_base.h BUILDS)
fastpersist_layer_include_check(incremental write/encoded_file_writer.h BUILDS)
fastpersist_layer_include_check(checkpoint incremental/incremental.h BUILDS)
fastpersist_layer_include_check(tier checkpoint/tier_link.h BUILDS)

# The command-line tool includes only public headers and its named helpers (the script says which).
add_test(NAME layering.tools_use_public_headers
         COMMAND "${CMAKE_COMMAND}" -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
                 -P "${PROJECT_SOURCE_DIR}/cmake/tools_include_check.cmake")
set_tests_properties(layering.tools_use_public_headers PROPERTIES LABELS layering)

# No layer's library calls a symbol only a layer above it defines (tests/cpp/layering/link_check.sh).
# Static libraries only: the sanitizer and the Python builds link the same ones.
add_test(NAME layering.no_calls_upward
         COMMAND "${PROJECT_SOURCE_DIR}/tests/cpp/layering/link_check.sh" "${CMAKE_NM}"
                 "${PROJECT_BINARY_DIR}/src" ${FASTPERSIST_LAYERS})
set_tests_properties(layering.no_calls_upward PROPERTIES LABELS layering)
