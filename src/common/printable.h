// SPDX-License-Identifier: Apache-2.0
// Quoting untrusted bytes (a damaged file's content) inside error messages: messages must stay
// valid UTF-8 (Python decodes them) and short (a header of padding should not flood a log).
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace fastpersist {

// Printable ASCII kept; every other byte written as \xNN; cut to `max_chars` with "...".
inline std::string printable(std::string_view text, size_t max_chars = 160) {
  std::string out;
  for (unsigned char c : text) {
    if (out.size() >= max_chars) {
      out += "...";
      break;
    }
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

}  // namespace fastpersist
