// SPDX-License-Identifier: Apache-2.0
// Lookups by name into one Manifest, built once in linear time, each O(1) after that: a
// checkpoint of a mixture-of-experts model holds 10^5 tensors or more, and a name looked up by
// a scan in a loop (Manifest::find_tensor) makes loading, verifying or inspecting it quadratic.
//
// Thread-safety: immutable after construction; any number of threads may look up at once.
// Lifetime: holds views into the manifest it was built from, which must outlive it and must
// not be modified while the index is used.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "fastpersist/manifest.h"

namespace fastpersist {

class ManifestIndex {
 public:
  explicit ManifestIndex(const Manifest& manifest);

  // Index into manifest.tensors / manifest.files by name, or nullopt.
  std::optional<size_t> tensor(std::string_view name) const;
  std::optional<size_t> file(std::string_view name) const;
  // The indices of the tensors stored in manifest.files[file_index], in manifest order (empty
  // for a file no tensor names, or an index out of range).
  std::span<const size_t> tensors_in(size_t file_index) const;

 private:
  std::unordered_map<std::string_view, size_t> tensors_;
  std::unordered_map<std::string_view, size_t> files_;
  std::vector<std::vector<size_t>> tensors_by_file_;
};

}  // namespace fastpersist
