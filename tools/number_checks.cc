// SPDX-License-Identifier: Apache-2.0
#include "number_checks.h"

#include <charconv>
#include <cmath>
#include <system_error>

namespace fastpersist::cli {

CLI::Validator finite_in(double min, double max) {
  const std::string range =
      "[" + CLI::detail::to_string(min) + ", " + CLI::detail::to_string(max) + "]";
  return CLI::Validator(
      [min, max, range](std::string& text) -> std::string {
        double value = 0;
        const char* end = text.data() + text.size();
        auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (ec != std::errc() || ptr != end || !std::isfinite(value)) {
          return "'" + text + "' is not a finite number";
        }
        if (value < min || value > max) return "'" + text + "' is not in " + range;
        return "";
      },
      "FINITE in " + range);
}

CLI::Validator integer_in(int64_t min, int64_t max) {
  const std::string range = "[" + std::to_string(min) + ", " + std::to_string(max) + "]";
  return CLI::Validator(
      [min, max, range](std::string& text) -> std::string {
        int64_t value = 0;
        const char* end = text.data() + text.size();
        auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (ec == std::errc::result_out_of_range) return "'" + text + "' is not in " + range;
        if (ec != std::errc() || ptr != end) return "'" + text + "' is not a whole number";
        if (value < min || value > max) return "'" + text + "' is not in " + range;
        return "";
      },
      "INT in " + range);
}

}  // namespace fastpersist::cli
