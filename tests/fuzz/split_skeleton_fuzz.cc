// SPDX-License-Identifier: Apache-2.0
// decode_split_skeleton, the decoder of a split file's skeleton (split_file.h), on any bytes:
// a Status, never a crash, and never a piece table larger than the input could hold.
#include <cstdlib>
#include <string_view>

#include "fastpersist/split_file.h"
#include "fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto decoded = fastpersist::decode_split_skeleton(bytes, "fuzz");
  if (decoded.is_ok()) {
    // What decoded is consistent: the pieces fit the file, in order, and the rest adds up.
    uint64_t end = 0, pieces = 0;
    for (const fastpersist::SplitPiece& p : decoded->pieces) {
      if (p.offset < end || p.length == 0 || p.length > decoded->size - p.offset) std::abort();
      end = p.offset + p.length;
      pieces += p.length;
    }
    if (decoded->size - pieces != decoded->rest.size() || decoded->pieces.size() > size / 16)
      std::abort();
  }
  return 0;
}
