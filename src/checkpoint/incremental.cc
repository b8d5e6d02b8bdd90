// SPDX-License-Identifier: Apache-2.0
#include "checkpoint/incremental.h"

#include <algorithm>
#include <atomic>
#include <set>
#include <unordered_map>

#include "checkpoint/checkpoint_fs.h"
#include "checkpoint/encoded_file_writer.h"
#include "common/task_pool.h"
#include "fastpersist/dtype.h"
#include "fastpersist/tensor_codec.h"

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
                     const std::vector<std::optional<ContentDigest>>& digests, const Manifest& base,
                     bool xor_deltas) {
  BaseMatch match;
  match.base_index.resize(tensors.size());
  match.delta_index.resize(tensors.size());
  std::unordered_map<std::string_view, size_t> by_name;
  by_name.reserve(base.tensors.size());
  for (size_t i = 0; i < base.tensors.size(); ++i) by_name.emplace(base.tensors[i].name, i);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorSource& t = tensors[i];
    auto it = by_name.find(t.name);
    bool same = false;
    bool previous = false;  // the base holds this tensor's previous version, in its own file
    if (it != by_name.end()) {
      const ManifestTensor& b = base.tensors[it->second];
      const ManifestFile* file = base.find_file(b.file);
      previous = b.dtype == t.dtype && b.shape == t.shape && b.length == t.nbytes && b.global_shape.empty() &&
                 file != nullptr && referenced_checkpoint(*file).empty();
      same = previous && i < digests.size() && digests[i] && b.digest && *b.digest == *digests[i];
    }
    if (same) {
      match.base_index[i] = it->second;
      match.referenced_bytes += t.nbytes;
      continue;
    }
    match.changed_bytes += t.nbytes;
    const DtypeInfo* dtype = find_dtype(t.dtype);
    const ManifestTensor* b = previous ? &base.tensors[it->second] : nullptr;
    if (xor_deltas && b != nullptr && dtype != nullptr && dtype->kind == DtypeKind::kFloat &&
        t.nbytes >= kMinEncodedTensorBytes && compression_of_encoding(b->encoding)) {
      match.delta_index[i] = it->second;
      match.delta_bytes += t.nbytes;
    }
  }
  return match;
}

Result<DeltaSource> delta_source(const Manifest& base, const std::string& base_tag, const std::string& base_dir,
                                 size_t index) {
  const ManifestTensor& b = base.tensors[index];
  const ManifestFile* file = base.find_file(b.file);
  if (file == nullptr) return Status(StatusCode::kInternal, "the base tensor's file is not listed");
  DeltaSource d;
  FP_ASSIGN_OR_RETURN(d.path, resolve_manifest_file(base_dir, *file));
  d.base.file = base_tag + "/" + b.file;
  d.base.offset = b.offset;
  d.base.stored_length = b.stored_length;
  d.base.encoding = b.encoding;
  d.base.checksum = b.checksum;
  return d;
}

ManifestTensor referenced_tensor(const Manifest& base, const std::string& base_tag, size_t index) {
  ManifestTensor t = base.tensors[index];
  t.file = base_tag + "/" + t.file;
  return t;
}

uint64_t own_stored_bytes(const Manifest& m) {
  uint64_t total = 0;
  for (const ManifestTensor& t : m.tensors) {
    const ManifestFile* f = m.find_file(t.file);
    if (f != nullptr && referenced_checkpoint(*f).empty()) total += t.stored_length;
  }
  return total;
}

std::vector<ManifestFile> referenced_files(const Manifest& base, const std::string& base_tag,
                                           const std::vector<ManifestTensor>& tensors) {
  std::set<std::string_view> used;
  const std::string prefix = base_tag + "/";
  auto note = [&](const std::string& file) {
    if (file.size() > prefix.size() && file.compare(0, prefix.size(), prefix) == 0) {
      used.insert(std::string_view(file).substr(prefix.size()));
    }
  };
  for (const ManifestTensor& t : tensors) {
    note(t.file);
    if (t.delta_base) note(t.delta_base->file);  // an XOR delta reads its base's bytes there
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


namespace {

// The changed tensors of `all` written, the unchanged ones recorded as references; records in
// the order of `all`, then the base files the references point into.
Result<ShardWriteResult> write_changed(ShardWriter& writer, const std::string& directory,
                                       const std::vector<TensorSource>& all, const BaseMatch& match,
                                       const IncrementalBase& base, const ShardWriteCallbacks& callbacks) {
  std::vector<TensorSource> changed;
  std::vector<std::optional<DeltaSource>> deltas;  // XOR deltas: per changed tensor
  bool any_delta = false;
  for (size_t i = 0; i < all.size(); ++i) {
    if (match.base_index[i]) continue;
    changed.push_back(all[i]);
    deltas.emplace_back();
    if (match.delta_index[i]) {
      FP_ASSIGN_OR_RETURN(deltas.back(), delta_source(*base.manifest, base.tag, base.dir, *match.delta_index[i]));
      any_delta = true;
    }
  }
  if (!any_delta) deltas.clear();
  FP_ASSIGN_OR_RETURN(ShardPlan plan, writer.plan(changed, deltas));
  FP_ASSIGN_OR_RETURN(ShardWriteResult data, writer.write(directory, changed, plan, callbacks));
  std::vector<ManifestTensor> written = std::move(data.tensors);
  data.tensors.clear();
  size_t next_written = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    data.tensors.push_back(match.base_index[i] ? referenced_tensor(*base.manifest, base.tag, *match.base_index[i])
                                               : std::move(written[next_written++]));
  }
  for (ManifestFile& f : referenced_files(*base.manifest, base.tag, data.tensors)) data.files.push_back(std::move(f));
  return data;
}

}  // namespace

Result<TensorWrite> write_tensors(ShardWriter& writer, const std::string& directory,
                                  const std::vector<TensorSource>& tensors, const ShardPlan* full_plan,
                                  const IncrementalBase* base, bool xor_deltas, unsigned threads,
                                  const ShardWriteCallbacks& callbacks) {
  // With a base, the tensors are hashed first, to know which to write. Without one the write is
  // full and the writer records the digests from the staged bytes, in the checksum's pass.
  std::vector<std::optional<ContentDigest>> digests;
  BaseMatch match;
  if (base != nullptr) {
    digests = digest_tensors(tensors, threads);
    match = match_base(tensors, digests, *base->manifest, xor_deltas);
  }
  TensorWrite out;
  out.references_base = base != nullptr && match.worth_it();
  Result<ShardWriteResult> written =
      out.references_base ? write_changed(writer, directory, tensors, match, *base, callbacks)
      : full_plan != nullptr ? writer.write(directory, tensors, *full_plan, callbacks)
                             : writer.write(directory, tensors, callbacks);
  FP_RETURN_IF_ERROR(written.status());
  out.data = std::move(written).value();
  for (size_t i = 0; i < digests.size(); ++i) {
    // A referenced tensor keeps the base's digest, which is the same.
    if (digests[i] && !out.data.tensors[i].digest) out.data.tensors[i].digest = digests[i];
  }
  if (out.references_base) out.referenced_bytes = match.referenced_bytes;
  return out;
}

}  // namespace fastpersist::checkpoint
