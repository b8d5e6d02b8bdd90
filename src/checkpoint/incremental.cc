// SPDX-License-Identifier: Apache-2.0
#include "checkpoint/incremental.h"

#include <algorithm>
#include <atomic>
#include <set>
#include <unordered_map>

#include "common/task_pool.h"

namespace fastpersist::checkpoint {

std::vector<std::optional<ContentDigest>> digest_tensors(const std::vector<TensorSource>& tensors,
                                                         unsigned threads) {
  std::vector<std::optional<ContentDigest>> out(tensors.size());
  uint64_t total = 0;
  for (const TensorSource& t : tensors) total += t.device < 0 ? t.nbytes : 0;
  // One task per worker, each taking the next tensor: big and small tensors mix, so a static
  // split would leave one worker with the largest ones.
  constexpr uint64_t kBytesPerWorker = uint64_t{64} << 20;
  size_t useful = static_cast<size_t>(std::min<uint64_t>(total / kBytesPerWorker + 1, tensors.size()));
  const size_t workers = TaskPool::choose_threads(threads, useful);
  TaskPool pool(workers > 1 ? workers : 0);  // one worker: the calling thread does it
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < tensors.size(); i = next++) {
      const TensorSource& t = tensors[i];
      if (t.device >= 0 || t.nbytes == 0 || t.data == nullptr) continue;
      out[i] = xxh3_128(t.data, t.nbytes);
    }
  };
  {
    TaskGroup group(pool);
    for (size_t w = 0; w < std::max<size_t>(workers, 1); ++w) group.run(work);
  }
  return out;
}

BaseMatch match_base(const std::vector<TensorSource>& tensors,
                     const std::vector<std::optional<ContentDigest>>& digests, const Manifest& base) {
  BaseMatch match;
  match.base_index.resize(tensors.size());
  std::unordered_map<std::string_view, size_t> by_name;
  by_name.reserve(base.tensors.size());
  for (size_t i = 0; i < base.tensors.size(); ++i) by_name.emplace(base.tensors[i].name, i);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorSource& t = tensors[i];
    auto it = by_name.find(t.name);
    bool same = false;
    if (it != by_name.end() && i < digests.size() && digests[i]) {
      const ManifestTensor& b = base.tensors[it->second];
      const ManifestFile* file = base.find_file(b.file);
      same = b.digest && *b.digest == *digests[i] && b.dtype == t.dtype && b.shape == t.shape &&
             b.length == t.nbytes && b.global_shape.empty() && file != nullptr &&
             referenced_checkpoint(*file).empty();
    }
    if (same) {
      match.base_index[i] = it->second;
      match.referenced_bytes += t.nbytes;
    } else {
      match.changed_bytes += t.nbytes;
    }
  }
  return match;
}

ManifestTensor referenced_tensor(const Manifest& base, const std::string& base_tag, size_t index) {
  ManifestTensor t = base.tensors[index];
  t.file = base_tag + "/" + t.file;
  return t;
}

std::vector<ManifestFile> referenced_files(const Manifest& base, const std::string& base_tag,
                                           const std::vector<ManifestTensor>& tensors) {
  std::set<std::string_view> used;
  const std::string prefix = base_tag + "/";
  for (const ManifestTensor& t : tensors) {
    if (t.file.size() > prefix.size() && t.file.compare(0, prefix.size(), prefix) == 0) {
      used.insert(std::string_view(t.file).substr(prefix.size()));
    }
  }
  std::vector<ManifestFile> out;
  for (const ManifestFile& f : base.files) {
    if (used.count(f.name) == 0) continue;
    ManifestFile ref = f;
    ref.name = prefix + f.name;
    out.push_back(std::move(ref));
  }
  return out;
}

}  // namespace fastpersist::checkpoint
