// SPDX-License-Identifier: Apache-2.0
// The text parsers of settings and flags: sizes ("64MiB"), backend names, checkpoint tags, object
// keys (a bucket's listing is untrusted) and URLs, and the CLI's numeric validators. Any text gives
// a value or an error, never a crash; a size that parses is the value its digits and unit say
// (checked against a second, wider computation).
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdlib>
#include <string>
#include <string_view>

#include "fastpersist/manifest.h"
#include "fastpersist/object_store.h"
#include "fastpersist/options.h"
#include "fuzz_target.h"
#include "number_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto parsed = fastpersist::parse_size(text);
  if (parsed.is_ok()) {
    // Formatting and parsing again must agree.
    auto again = fastpersist::parse_size(std::to_string(parsed.value()));
    FUZZ_CHECK(again.is_ok() && again.value() == parsed.value());
  }
  (void)fastpersist::parse_backend(text);
  (void)fastpersist::check_tag_syntax(text);
  (void)fastpersist::is_object_store_url(text);
  if (fastpersist::ObjectStore::check_key(text).is_ok()) {
    // An accepted key never leaves its prefix: relative, no empty, "." or ".." segment.
    FUZZ_CHECK(!text.empty() && text.front() != '/' && text.back() != '/');
    FUZZ_CHECK(text.find("//") == std::string::npos);
    std::string segmented = "/" + text + "/";
    FUZZ_CHECK(segmented.find("/../") == std::string::npos &&
               segmented.find("/./") == std::string::npos);
  }
  static const CLI::Validator finite = fastpersist::cli::finite_in(0, 1e9);
  static const CLI::Validator integer = fastpersist::cli::integer_in(-1000, 1000000);
  std::string copy = text;
  if (finite(copy).empty()) {
    double v = std::strtod(text.c_str(), nullptr);
    FUZZ_CHECK(std::isfinite(v) && v >= 0 && v <= 1e9);
  }
  copy = text;
  if (integer(copy).empty()) {
    long long v = std::strtoll(text.c_str(), nullptr, 10);
    FUZZ_CHECK(v >= -1000 && v <= 1000000);
  }
  return 0;
}
