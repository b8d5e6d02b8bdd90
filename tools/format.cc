// SPDX-License-Identifier: Apache-2.0
#include "format.h"

#include <cstdio>

namespace fastpersist::cli {

std::string format_bytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  unsigned unit = 0;
  while (unit + 1 < std::size(kUnits) && bytes >= (uint64_t{1024} << (10 * unit))) ++unit;
  const uint64_t scale = uint64_t{1} << (10 * unit);
  if (bytes % scale == 0) return std::to_string(bytes / scale) + " " + kUnits[unit];
  return format_fixed(static_cast<double>(bytes) / static_cast<double>(scale), 2) + " " +
         kUnits[unit];
}

std::string format_limit(uint64_t bytes) {
  return bytes == UINT64_MAX ? "unlimited" : format_bytes(bytes);
}

std::string format_fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", digits, value);
  return text;
}

std::string on_off(bool value) { return value ? "on" : "off"; }

std::string json_text(const nlohmann::ordered_json& j) {
  return j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace fastpersist::cli
