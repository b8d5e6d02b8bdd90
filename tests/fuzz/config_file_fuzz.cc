// SPDX-License-Identifier: Apache-2.0
// parse_config, the reader of configuration files (`fastpersist tune --output`,
// FASTPERSIST_CONFIG), on any bytes: a configuration or an error, never a crash. A configuration it
// accepts holds settings that validate, and encoding it and parsing the text again gives the same
// settings.
#include <string>
#include <string_view>

#include "fastpersist/config_file.h"
#include "fuzz_target.h"

namespace {

bool same_engine(const fastpersist::EngineOptions& a, const fastpersist::EngineOptions& b) {
  return a.backend == b.backend && a.block_size == b.block_size && a.queue_depth == b.queue_depth &&
         a.single_submit == b.single_submit && a.overlap_events == b.overlap_events &&
         a.intra_op_parallelism == b.intra_op_parallelism && a.direct_io == b.direct_io &&
         a.direct_io_min_bytes == b.direct_io_min_bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto parsed = fastpersist::parse_config(text, "fuzz");
  if (!parsed.is_ok()) {
    FUZZ_CHECK(!parsed.status().message().empty());
    return 0;
  }
  const fastpersist::ConfigFile& c = parsed.value();
  FUZZ_CHECK(c.engine.validate().is_ok());
  if (c.writer_io_buffer_bytes) FUZZ_CHECK(*c.writer_io_buffer_bytes % 8192 == 0);
  std::string encoded = fastpersist::encode_config(c.engine, c.writer_io_buffer_bytes);
  auto again = fastpersist::parse_config(encoded, "fuzz (encoded again)");
  FUZZ_CHECK(again.is_ok());
  FUZZ_CHECK(same_engine(again.value().engine, c.engine));
  FUZZ_CHECK(again.value().writer_io_buffer_bytes == c.writer_io_buffer_bytes);
  return 0;
}
