// SPDX-License-Identifier: Apache-2.0
// Typed access to the fields of one manifest JSON object, private to manifest.cc. Every failure
// is kDataLoss naming the field by its full name ("tensors[3].offset"), so a user who opens the
// file can find what is wrong without reading our code.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "fastpersist/checksum.h"
#include "fastpersist/status.h"

namespace fastpersist::format_internal {

// Keeps the key order of the user's metadata and of each tensor's fields.
using ManifestJson = nlohmann::ordered_json;

// Reads fields of one JSON object; `where` ("files[2]") prefixes field names in errors.
class Fields {
 public:
  Fields(const ManifestJson& object, std::string where, const std::string& path)
      : object_(object), where_(std::move(where)), path_(path) {}

  std::string name(std::string_view key) const {
    return where_.empty() ? std::string(key) : where_ + "." + std::string(key);
  }
  Status error(std::string_view key, const std::string& problem) const {
    return Status(StatusCode::kDataLoss, "manifest field '" + name(key) + "' " + problem)
        .with_path(path_);
  }
  const std::string& path() const { return path_; }
  bool has(std::string_view key) const { return object_.find(std::string(key)) != object_.end(); }
  Result<const ManifestJson*> get(std::string_view key) const {
    auto it = object_.find(std::string(key));
    if (it == object_.end()) return error(key, "is missing");
    return &*it;
  }
  Result<std::string> string(std::string_view key, bool non_empty = false) const {
    FP_ASSIGN_OR_RETURN(const ManifestJson* j, get(key));
    if (!j->is_string()) return error(key, "is not a string");
    if (non_empty && j->get_ref<const std::string&>().empty()) return error(key, "is empty");
    return j->get<std::string>();
  }
  Result<uint64_t> u64(std::string_view key) const {
    FP_ASSIGN_OR_RETURN(const ManifestJson* j, get(key));
    if (!j->is_number_unsigned()) return error(key, "is not a non-negative integer");
    return j->get<uint64_t>();
  }
  Result<uint64_t> checksum(std::string_view key) const {
    FP_ASSIGN_OR_RETURN(std::string text, string(key));
    std::optional<uint64_t> value = checksum_from_hex(text);
    if (!value) return error(key, "is not 16 lowercase hex digits");
    return *value;
  }
  Result<std::map<std::string, std::string>> string_map(std::string_view key) const {
    FP_ASSIGN_OR_RETURN(const ManifestJson* j, get(key));
    if (!j->is_object()) return error(key, "is not an object");
    std::map<std::string, std::string> out;
    for (const auto& [k, v] : j->items()) {
      if (!v.is_string()) return error(std::string(key) + "." + k, "is not a string");
      out.emplace(k, v.get<std::string>());
    }
    return out;
  }
  Result<const ManifestJson*> array(std::string_view key) const {
    FP_ASSIGN_OR_RETURN(const ManifestJson* j, get(key));
    if (!j->is_array()) return error(key, "is not a list");
    return j;
  }

 private:
  const ManifestJson& object_;
  std::string where_;
  const std::string& path_;
};

}  // namespace fastpersist::format_internal
