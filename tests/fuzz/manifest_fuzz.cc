// SPDX-License-Identifier: Apache-2.0
// decode_manifest (formats v1 and v2) on any bytes: it returns a Status or a manifest, never
// crashes, and a manifest it accepts encodes and decodes again to the same content.
#include <string>
#include <string_view>

#include "fastpersist/manifest.h"
#include "fuzz_target.h"

using fastpersist::decode_manifest;
using fastpersist::encode_manifest;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view json(reinterpret_cast<const char*>(data), size);
  auto first = decode_manifest(json, "fuzz/manifest.json");
  if (!first.is_ok()) return 0;
  const fastpersist::Manifest& m = first.value();
  FUZZ_CHECK(m.sequence >= 1 && m.sequence <= fastpersist::kMaxManifestSequence);
  for (const auto& t : m.tensors) FUZZ_CHECK(m.find_file(t.file) != nullptr);
  // Round trip: what we accept, we can write back and read again unchanged.
  std::string encoded = encode_manifest(m);
  auto second = decode_manifest(encoded, "fuzz/manifest.json");
  FUZZ_CHECK(second.is_ok());
  const fastpersist::Manifest& r = second.value();
  FUZZ_CHECK(r.tag == m.tag && r.sequence == m.sequence && r.step == m.step);
  FUZZ_CHECK(r.tensors.size() == m.tensors.size() && r.files.size() == m.files.size());
  FUZZ_CHECK(r.metadata_json == m.metadata_json);
  FUZZ_CHECK(fastpersist::manifest_fingerprint(r.tensors) ==
             fastpersist::manifest_fingerprint(m.tensors));
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    FUZZ_CHECK(r.tensors[i].offset == m.tensors[i].offset);
    FUZZ_CHECK(r.tensors[i].stored_length == m.tensors[i].stored_length);
    FUZZ_CHECK(r.tensors[i].checksum == m.tensors[i].checksum);
  }
  return 0;
}
