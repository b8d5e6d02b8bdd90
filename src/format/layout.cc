// SPDX-License-Identifier: Apache-2.0
#include "fastpersist/layout.h"

#include <cstdio>

namespace fastpersist {

std::string data_file_name(size_t index, size_t count, std::optional<uint32_t> rank) {
  char numbers[64];
  std::snprintf(numbers, sizeof(numbers), "%05zu-of-%05zu", index, count);
  std::string name(kDataFilePrefix);
  if (rank) {
    char rank_text[16];
    std::snprintf(rank_text, sizeof(rank_text), "%05u-", static_cast<unsigned>(*rank));
    name.append(kDataFileRankMarker).append(rank_text);
  }
  return name.append(numbers).append(kDataFileSuffix);
}

std::string dcp_objects_file_name(uint32_t rank) {
  char rank_text[16];
  std::snprintf(rank_text, sizeof(rank_text), "%05u", static_cast<unsigned>(rank));
  return std::string(kDcpObjectsFilePrefix)
      .append(kDataFileRankMarker)
      .append(rank_text)
      .append(kDcpObjectsFileSuffix);
}

bool is_data_file_name(std::string_view name) {
  return name.size() > kDataFilePrefix.size() + kDataFileSuffix.size() &&
         name.substr(0, kDataFilePrefix.size()) == kDataFilePrefix &&
         name.substr(name.size() - kDataFileSuffix.size()) == kDataFileSuffix;
}

std::string replace_temp_prefix(std::string_view name) {
  return std::string(".").append(name).append(kReplaceTempInfix);
}

}  // namespace fastpersist
