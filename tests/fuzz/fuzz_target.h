// SPDX-License-Identifier: Apache-2.0
// The entry point every fuzz target defines. Built with FASTPERSIST_FUZZ=ON (clang), libFuzzer
// calls it; otherwise replay_main.cc calls it once per file of the target's corpus, so ctest
// replays the seeds and every input that ever crashed (tests/fuzz/corpus/<target>/).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

// A property of the parser that failed on this input: stop the way a crash would, so libFuzzer
// saves the input and the replay test fails.
#define FUZZ_CHECK(cond)                                                                 \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: fuzz check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)
