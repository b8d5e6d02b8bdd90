// SPDX-License-Identifier: Apache-2.0
// check_metadata_json, the check of a user's metadata (and of every JSON object a manifest
// holds), on any bytes: a Status, never a crash or a stack overflow.
#include <string_view>

#include "fastpersist/manifest.h"
#include "fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)fastpersist::check_metadata_json(
      std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
