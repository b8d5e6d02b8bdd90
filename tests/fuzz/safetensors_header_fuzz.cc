// SPDX-License-Identifier: Apache-2.0
// parse_safetensors_header on any file: the input is the whole file. It returns a Status or a
// header, never crashes, and a header it accepts lies inside the file, tensors in order,
// each tensor's byte count matching its dtype and shape.
#include <string_view>

#include "fastpersist/safetensors.h"
#include "fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view file(reinterpret_cast<const char*>(data), size);
  auto parsed = fastpersist::parse_safetensors_header(file, size, "fuzz.safetensors");
  if (!parsed.is_ok()) return 0;
  const fastpersist::SafetensorsHeader& h = parsed.value();
  FUZZ_CHECK(h.data_start >= 8 && h.file_bytes() == size);
  uint64_t previous_end = 0;
  for (const auto& t : h.tensors) {
    FUZZ_CHECK(t.begin <= t.end && t.end <= h.data_bytes);
    FUZZ_CHECK(t.begin >= previous_end);
    previous_end = t.end;
    auto element = fastpersist::safetensors_dtype_size(t.dtype);
    FUZZ_CHECK(element.has_value());
    uint64_t count = 1;
    for (uint64_t d : t.shape) count *= d;
    FUZZ_CHECK(count * *element == t.nbytes());
    FUZZ_CHECK(h.find(t.name).has_value());
  }
  return 0;
}
