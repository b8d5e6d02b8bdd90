# SPDX-License-Identifier: Apache-2.0
# FASTPERSIST_SANITIZE=address,undefined (or thread): compile and link every target in this
# project with those sanitizers. Set here, before any target exists, rather than through
# CMAKE_CXX_FLAGS, so the flags reach C and C++ sources, the libraries, the CLI and the tests
# alike and cannot be dropped by a preset or command line that also sets CMAKE_CXX_FLAGS.
# GoogleTest comes prebuilt from libgtest-dev and is not instrumented; that is harmless (it only
# runs on the test's own threads and synchronises with pthread calls the sanitizers intercept).
set(FASTPERSIST_SANITIZE "" CACHE STRING
    "Sanitizers for every target: address,undefined | thread | empty for none")

if(FASTPERSIST_SANITIZE)
  string(REPLACE "," ";" fastpersist_sanitizers "${FASTPERSIST_SANITIZE}")
  if("thread" IN_LIST fastpersist_sanitizers AND "address" IN_LIST fastpersist_sanitizers)
    message(FATAL_ERROR "FASTPERSIST_SANITIZE: thread and address cannot be combined")
  endif()
  set(fastpersist_sanitize_flags -fsanitize=${FASTPERSIST_SANITIZE} -fno-omit-frame-pointer)
  # A report fails the test instead of scrolling past in its output ("all": GCC's "undefined"
  # leaves out float-cast-overflow, which the asan preset adds).
  list(APPEND fastpersist_sanitize_flags -fno-sanitize-recover=all)
  add_compile_options(${fastpersist_sanitize_flags})
  add_link_options(${fastpersist_sanitize_flags})
  message(STATUS "fastpersist: sanitizers ${FASTPERSIST_SANITIZE}")
endif()

# FASTPERSIST_FUZZ: libFuzzer's coverage instrumentation in every target, so the fuzzer sees the
# branches of the library code it drives (the fuzz targets add -fsanitize=fuzzer when linking).
if(FASTPERSIST_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "FASTPERSIST_FUZZ needs clang (libFuzzer); configure with CXX=clang++")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
