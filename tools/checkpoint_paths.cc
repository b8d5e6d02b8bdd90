// SPDX-License-Identifier: Apache-2.0
#include "checkpoint_paths.h"

#include <ctime>
#include <iostream>

namespace fastpersist::cli {

std::string wrong_kind(const PathInfo& info, const std::string& wanted) {
  return info.path + " is " + std::string(describe_path_kind(info.kind)) + ", not " + wanted;
}

int fail(const std::string& command, const std::string& message, int code) {
  std::cout.flush();
  std::cerr << "fastpersist " << command << ": error: " << message << "\n";
  return code;
}

std::string iso_time_utc(double unix_seconds) {
  // A damaged manifest may hold any number; casting one beyond time_t's range is undefined.
  if (!(unix_seconds > -1e15 && unix_seconds < 1e15)) return "?";
  std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  if (::gmtime_r(&t, &tm) == nullptr) return "?";
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

std::string shape_string(const std::vector<uint64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

std::vector<SkippedDir> split_skipped(const std::vector<std::string>& skipped) {
  std::vector<SkippedDir> out;
  for (const std::string& s : skipped) {
    size_t colon = s.find(": ");
    if (colon == std::string::npos) {
      out.push_back({s, ""});
    } else {
      out.push_back({s.substr(0, colon), s.substr(colon + 2)});
    }
  }
  return out;
}

std::string pad(const std::string& text, size_t width) {
  return text.size() >= width ? text : text + std::string(width - text.size(), ' ');
}

}  // namespace fastpersist::cli
