// SPDX-License-Identifier: Apache-2.0
// Human-readable numbers for the CLI's text output (JSON output keeps raw numbers).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace fastpersist::cli {

// Binary units, exact when possible: 4096 -> "4 KiB", 1536 -> "1.50 KiB", 100 -> "100 B".
std::string format_bytes(uint64_t bytes);
// A resource limit in bytes where UINT64_MAX means "unlimited".
std::string format_limit(uint64_t bytes);
// `value` with `digits` decimals: format_fixed(2.345, 2) -> "2.35" (rounded, not truncated).
std::string format_fixed(double value, int digits);
std::string on_off(bool value);
// `j` as indented JSON text for --json output. Bytes that are not UTF-8 (a path on a filesystem
// that allows any byte) become U+FFFD instead of aborting the output: JSON holds only UTF-8.
std::string json_text(const nlohmann::ordered_json& j);

}  // namespace fastpersist::cli
