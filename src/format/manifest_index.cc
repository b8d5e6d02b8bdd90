// SPDX-License-Identifier: Apache-2.0
#include "fastpersist/manifest_index.h"

namespace fastpersist {

ManifestIndex::ManifestIndex(const Manifest& manifest) : tensors_by_file_(manifest.files.size()) {
  files_.reserve(manifest.files.size());
  for (size_t i = 0; i < manifest.files.size(); ++i) files_.emplace(manifest.files[i].name, i);
  tensors_.reserve(manifest.tensors.size());
  for (size_t i = 0; i < manifest.tensors.size(); ++i) {
    const ManifestTensor& t = manifest.tensors[i];
    tensors_.emplace(t.name, i);  // a decoded manifest has no duplicates; else the first wins
    auto f = files_.find(t.file);
    if (f != files_.end()) tensors_by_file_[f->second].push_back(i);
  }
}

std::optional<size_t> ManifestIndex::tensor(std::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return std::nullopt;
  return it->second;
}

std::optional<size_t> ManifestIndex::file(std::string_view name) const {
  auto it = files_.find(name);
  if (it == files_.end()) return std::nullopt;
  return it->second;
}

std::span<const size_t> ManifestIndex::tensors_in(size_t file_index) const {
  if (file_index >= tensors_by_file_.size()) return {};
  return tensors_by_file_[file_index];
}

}  // namespace fastpersist
