// SPDX-License-Identifier: Apache-2.0
#include "incremental/incremental.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

#include "checkpoint_dir/checkpoint_fs.h"
#include "common/task_pool.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/dtype.h"
#include "fastpersist/tensor_codec.h"
#include "write/encoded_file_writer.h"

namespace fastpersist::checkpoint {

std::vector<std::optional<ContentDigest>> digest_tensors(const std::vector<TensorSource>& tensors,
                                                         unsigned threads) {
  std::vector<std::optional<ContentDigest>> out(tensors.size());
  uint64_t total = 0;
  for (const TensorSource& t : tensors) total += t.device < 0 ? t.nbytes : 0;
  // One task per worker, each taking the next tensor: big and small tensors mix, so a static
  // split would leave one worker with the largest ones.
  constexpr uint64_t kBytesPerWorker = uint64_t{64} << 20;
  size_t useful =
      static_cast<size_t>(std::min<uint64_t>(total / kBytesPerWorker + 1, tensors.size()));
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
      previous = b.dtype == t.dtype && b.shape == t.shape && b.length == t.nbytes &&
                 b.global_shape.empty() && file != nullptr && referenced_checkpoint(*file).empty();
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

Result<DeltaSource> delta_source(const Manifest& base, const std::string& base_tag,
                                 const std::string& base_dir, size_t index) {
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

// check_base_tensors' memory: per base, the tensors found intact.
struct CheckedBases {
  std::mutex mu;
  std::map<std::string, std::set<size_t>> intact;
};

CheckedBases& checked_bases() {
  static CheckedBases* bases = new CheckedBases();  // never destroyed: used until exit
  return *bases;
}

std::string base_key(const IncrementalBase& base) {
  return base.dir + "\n" + std::to_string(base.manifest->sequence) + "\n" +
         base.manifest->fingerprint;
}

// Whether base tensor `index` reads back with its checksum and digest.
bool tensor_intact(CheckpointReader& reader, size_t index) {
  const ManifestTensor& t = reader.manifest().tensors[index];
  if (!t.digest) return false;
  Xxh3Stream hash;
  constexpr uint64_t kPieceBytes = uint64_t{8} << 20;
  Status st = reader.read_pieces(index, kPieceBytes,
                                 /*verify=*/reader.manifest().checksum_algorithm != kNoChecksum,
                                 [&](uint64_t, const std::byte* data, size_t n) {
                                   hash.update(data, n);
                                   return Status::ok();
                                 });
  return st.is_ok() && hash.digest128() == *t.digest;
}

// The changed tensors of `all` written, the unchanged ones recorded as references; records in
// the order of `all`, then the base files the references point into.
Result<ShardWriteResult> write_changed(ShardWriter& writer, const std::string& directory,
                                       const std::vector<TensorSource>& all, const BaseMatch& match,
                                       const IncrementalBase& base,
                                       const ShardWriteCallbacks& callbacks) {
  std::vector<TensorSource> changed;
  std::vector<std::optional<DeltaSource>> deltas;  // XOR deltas: per changed tensor
  bool any_delta = false;
  for (size_t i = 0; i < all.size(); ++i) {
    if (match.base_index[i]) continue;
    changed.push_back(all[i]);
    deltas.emplace_back();
    if (match.delta_index[i]) {
      FP_ASSIGN_OR_RETURN(deltas.back(),
                          delta_source(*base.manifest, base.tag, base.dir, *match.delta_index[i]));
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
    data.tensors.push_back(match.base_index[i]
                               ? referenced_tensor(*base.manifest, base.tag, *match.base_index[i])
                               : std::move(written[next_written++]));
  }
  for (ManifestFile& f : referenced_files(*base.manifest, base.tag, data.tensors))
    data.files.push_back(std::move(f));
  return data;
}

}  // namespace

std::vector<bool> check_base_tensors(const IncrementalBase& base,
                                     const std::vector<size_t>& indices,
                                     std::shared_ptr<IoEngine> engine) {
  std::vector<bool> ok(indices.size(), false);
  const std::string key = base_key(base);
  std::vector<size_t> todo;  // positions in `indices` not known intact yet
  {
    CheckedBases& bases = checked_bases();
    std::lock_guard lock(bases.mu);
    const std::set<size_t>& known = bases.intact[key];
    for (size_t i = 0; i < indices.size(); ++i) {
      if (known.count(indices[i]) != 0) {
        ok[i] = true;
      } else {
        todo.push_back(i);
      }
    }
  }
  if (todo.empty()) return ok;
  auto reader = CheckpointReader::open(base.dir, std::move(engine));
  if (!reader.is_ok()) return ok;
  const Manifest& m = (*reader)->manifest();
  // The manifest on disk must be the one the save matched against (the same records).
  if (m.sequence != base.manifest->sequence || m.fingerprint != base.manifest->fingerprint ||
      m.tensors.size() != base.manifest->tensors.size()) {
    return ok;
  }
  std::vector<size_t> found;
  for (size_t i : todo) {
    const size_t index = indices[i];
    const ManifestTensor& t = m.tensors[index];
    const ManifestTensor& matched = base.manifest->tensors[index];
    if (t.name != matched.name || t.digest != matched.digest || t.checksum != matched.checksum)
      continue;
    if (tensor_intact(**reader, index)) {
      ok[i] = true;
      found.push_back(index);
    }
  }
  CheckedBases& bases = checked_bases();
  std::lock_guard lock(bases.mu);
  bases.intact[key].insert(found.begin(), found.end());
  return ok;
}

Result<TensorWrite> write_tensors(ShardWriter& writer, const std::string& directory,
                                  const std::vector<TensorSource>& tensors,
                                  const ShardPlan* full_plan, const IncrementalBase* base,
                                  bool xor_deltas, unsigned threads,
                                  const ShardWriteCallbacks& callbacks) {
  // With a base, the tensors are hashed first, to know which to write. Without one the write is
  // full and the writer records the digests from the staged bytes, in the checksum's pass.
  std::vector<std::optional<ContentDigest>> digests;
  BaseMatch match;
  if (base != nullptr) {
    digests = digest_tensors(tensors, threads);
    match = match_base(tensors, digests, *base->manifest, xor_deltas);
    if (!base->trusted && match.worth_it()) {
      // Records read from disk: reference only base tensors whose bytes are checked (the
      // others are written, as changed ones).
      std::vector<size_t> matched, positions;
      for (size_t i = 0; i < tensors.size(); ++i) {
        if (match.base_index[i]) {
          matched.push_back(*match.base_index[i]);
          positions.push_back(i);
        }
      }
      std::vector<bool> intact = check_base_tensors(
          *base, matched, std::shared_ptr<IoEngine>(&writer.engine(), [](IoEngine*) {}));
      for (size_t k = 0; k < positions.size(); ++k) {
        if (intact[k]) continue;
        const size_t i = positions[k];
        match.base_index[i].reset();
        match.referenced_bytes -= tensors[i].nbytes;
        match.changed_bytes += tensors[i].nbytes;
      }
    }
  }
  TensorWrite out;
  out.references_base = base != nullptr && match.worth_it();
  Result<ShardWriteResult> written =
      out.references_base    ? write_changed(writer, directory, tensors, match, *base, callbacks)
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
