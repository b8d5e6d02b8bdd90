// SPDX-License-Identifier: Apache-2.0
// The commit protocol of one checkpoint; the numbered steps are those of save_job.h.
#include "checkpoint/save_job.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <utility>


#include "checkpoint/checkpoint_fs.h"
#include "checkpoint/commit_steps.h"
#include "checkpoint/incremental.h"
#include "fastpersist/checksum.h"
#include "fastpersist/layout.h"
#include "fastpersist/manifest.h"

namespace fastpersist::checkpoint {
namespace {

Manifest build_manifest(const SaveJob& job, ShardWriteResult data, uint64_t objects_checksum) {
  const CheckpointContent& c = job.content;
  Manifest m;
  m.tag = job.tag;
  m.step = c.step;
  m.sequence = job.sequence;
  m.versions = c.versions;
  m.versions["fastpersist"] = FASTPERSIST_VERSION;
  m.metadata_json = c.metadata_json;
  m.aliases = c.aliases;
  m.files = std::move(data.files);
  m.tensors = std::move(data.tensors);  // the caller's order: the order a loader reports
  ManifestFile objects;
  objects.name = std::string(kObjectsFileName);
  objects.role = "objects";
  objects.size = c.objects.size();
  objects.checksum = objects_checksum;
  objects.checksum_bytes = c.objects.size();
  m.files.push_back(std::move(objects));
  m.fingerprint = manifest_fingerprint(m.tensors);
  m.created_unix = unix_now();
  {
    std::lock_guard lock(job.state->mu);  // the snapshot is over: its end is set
    m.blocking_seconds = std::chrono::duration<double>(job.state->snapshot_end - job.state->queued).count();
  }
  return m;
}

Status check_aliases(const CheckpointContent& c) {
  for (const auto& entry : c.aliases) {
    // Named copies, not structured bindings: clang before 16 cannot capture those in lambdas.
    const std::string& alias = entry.first;
    const std::string& target = entry.second;
    bool found = std::any_of(c.tensors.begin(), c.tensors.end(),
                             [&](const TensorSource& t) { return t.name == target; });
    if (!found) {
      return {StatusCode::kInvalidArgument,
              "alias '" + alias + "' points at '" + target + "', which is not a saved tensor"};
    }
    bool clash = std::any_of(c.tensors.begin(), c.tensors.end(),
                             [&](const TensorSource& t) { return t.name == alias; });
    if (clash) return {StatusCode::kInvalidArgument, "alias '" + alias + "' is also a tensor name"};
  }
  return Status::ok();
}

// Step 2 of an incremental save: only the tensors that differ from the base are written; the
// others become references. The records come back in the caller's order, like a full write's.
Result<ShardWriteResult> write_changed(const SaveJob& job, const std::string& tmp, ShardWriter& writer,
                                       const BaseMatch& match, const ShardWriteCallbacks& callbacks) {
  const std::vector<TensorSource>& all = job.content.tensors;
  std::vector<TensorSource> changed;
  std::vector<std::optional<DeltaSource>> deltas;  // XOR deltas: per changed tensor
  bool any_delta = false;
  const std::string base_dir = join_path(job.root, job.base_tag);
  for (size_t i = 0; i < all.size(); ++i) {
    if (match.base_index[i]) continue;
    changed.push_back(all[i]);
    deltas.emplace_back();
    if (match.delta_index[i]) {
      FP_ASSIGN_OR_RETURN(deltas.back(), delta_source(*job.base, job.base_tag, base_dir, *match.delta_index[i]));
      any_delta = true;
    }
  }
  if (!any_delta) deltas.clear();
  FP_ASSIGN_OR_RETURN(ShardPlan plan, writer.plan(changed, deltas));
  FP_ASSIGN_OR_RETURN(ShardWriteResult data, writer.write(tmp, changed, plan, callbacks));
  std::vector<ManifestTensor> written = std::move(data.tensors);
  data.tensors.clear();
  size_t next_written = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    data.tensors.push_back(match.base_index[i]
                               ? referenced_tensor(*job.base, job.base_tag, *match.base_index[i])
                               : std::move(written[next_written++]));
  }
  for (ManifestFile& f : referenced_files(*job.base, job.base_tag, data.tensors)) {
    data.files.push_back(std::move(f));
  }
  return data;
}

Status run_steps(const SaveJob& job, const std::string& tmp, const CheckpointOptions& options,
                 ShardWriter& writer, uint64_t* bytes_written, std::shared_ptr<const Manifest>* committed) {
  // 1.
  if (::mkdir(tmp.c_str(), 0755) != 0) {
    return Status::from_errno(errno, "cannot create the checkpoint's temporary directory").with_path(tmp);
  }
  // 2.
  ShardWriteCallbacks callbacks;
  callbacks.on_snapshot_done = [&job] { job.state->mark_snapshot_done(); };
  // With a base, the tensors are hashed first, to know which to write. Without one the save is
  // full and the writer records the digests from the staged bytes, in the checksum's pass.
  std::vector<std::optional<ContentDigest>> digests;
  if (job.base) digests = digest_tensors(job.content.tensors, options.compression_threads);
  BaseMatch match;
  if (job.base) match = match_base(job.content.tensors, digests, *job.base, options.xor_deltas);
  const bool incremental = job.base && match.worth_it();
  Result<ShardWriteResult> written =
      incremental ? write_changed(job, tmp, writer, match, callbacks)
                  : writer.write(tmp, job.content.tensors, job.plan, callbacks);
  FP_RETURN_IF_ERROR(written.status());
  ShardWriteResult data = std::move(written).value();
  for (size_t i = 0; i < digests.size(); ++i) {
    // A referenced tensor keeps the base's digest, which is the same.
    if (digests[i] && !data.tensors[i].digest) data.tensors[i].digest = digests[i];
  }
  {
    std::lock_guard lock(job.state->mu);
    job.state->checksum_seconds = data.checksum_seconds;
    job.state->base_tag = incremental ? job.base_tag : "";
    job.state->referenced_bytes = incremental ? match.referenced_bytes : 0;
  }
  const uint64_t data_bytes = data.bytes_written;
  // 3.
  const std::string& objects = job.content.objects;
  FP_RETURN_IF_ERROR(write_new_file(join_path(tmp, kObjectsFileName), objects, options.durable));
  uint64_t objects_sum = options.checksums ? xxh3_64(objects.data(), objects.size()) : 0;
  Manifest manifest = build_manifest(job, std::move(data), objects_sum);
  if (!options.checksums) manifest.checksum_algorithm = std::string(kNoChecksum);
  // 3b.-5.
  uint64_t manifest_bytes = 0;
  FP_RETURN_IF_ERROR(commit_temp_directory({job.root, job.tag, tmp, options.durable, job.pointer_mu},
                                           manifest, &manifest_bytes));
  *bytes_written = data_bytes + objects.size() + manifest_bytes;
  if (committed != nullptr) *committed = std::make_shared<const Manifest>(std::move(manifest));
  return Status::ok();
}

}  // namespace

Result<ShardPlan> plan_content(const CheckpointContent& content, const ShardWriter& writer) {
  FP_RETURN_IF_ERROR(check_metadata_json(content.metadata_json));
  FP_RETURN_IF_ERROR(check_aliases(content));
  return writer.plan(content.tensors);
}

Status run_save_job(const SaveJob& job, const CheckpointOptions& options, ShardWriter& writer,
                    uint64_t* bytes_written, std::shared_ptr<const Manifest>* committed) {
  *bytes_written = 0;
  std::string tmp = join_path(job.root, std::string(kTempDirPrefix) + job.tag + "-" + unique_suffix());
  Status st = run_steps(job, tmp, options, writer, bytes_written, committed);
  if (!st.is_ok()) {
    // Best effort: the next manager removes leftovers anyway. The original error wins.
    (void)remove_tree(tmp);
  }
  return st;
}

}  // namespace fastpersist::checkpoint
