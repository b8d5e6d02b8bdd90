// SPDX-License-Identifier: Apache-2.0
// The commit protocol of one checkpoint; the numbered steps are those of save_job.h.
#include "checkpoint/save_job.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <utility>

#include "checkpoint/commit_steps.h"
#include "checkpoint_dir/checkpoint_fs.h"
#include "fastpersist/checksum.h"
#include "fastpersist/layout.h"
#include "fastpersist/manifest.h"
#include "incremental/incremental.h"

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
    m.blocking_seconds =
        std::chrono::duration<double>(job.state->snapshot_end - job.state->queued).count();
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

Status run_steps(const SaveJob& job, const std::string& tmp, const CheckpointOptions& options,
                 ShardWriter& writer, uint64_t* bytes_written,
                 std::shared_ptr<const Manifest>* committed) {
  // 1.
  if (::mkdir(tmp.c_str(), 0755) != 0) {
    return Status::from_errno(errno, "cannot create the checkpoint's temporary directory")
        .with_path(tmp);
  }
  // 2.
  ShardWriteCallbacks callbacks;
  callbacks.on_snapshot_done = [&job] { job.state->mark_snapshot_done(); };
  IncrementalBase base;
  if (job.base)
    base = {job.base_tag, join_path(job.root, job.base_tag), job.base, job.base_trusted};
  FP_ASSIGN_OR_RETURN(
      TensorWrite written,
      write_tensors(writer, tmp, job.content.tensors, &job.plan, job.base ? &base : nullptr,
                    options.xor_deltas, options.compression_threads, callbacks));
  ShardWriteResult data = std::move(written.data);
  {
    std::lock_guard lock(job.state->mu);
    job.state->checksum_seconds = data.checksum_seconds;
    job.state->base_tag = written.references_base ? job.base_tag : "";
    job.state->referenced_bytes = written.referenced_bytes;
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
  FP_RETURN_IF_ERROR(commit_temp_directory(
      {job.root, job.tag, tmp, options.durable, job.pointer_mu}, manifest, &manifest_bytes));
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
  std::string tmp =
      join_path(job.root, std::string(kTempDirPrefix) + job.tag + "-" + unique_suffix());
  Status st = run_steps(job, tmp, options, writer, bytes_written, committed);
  if (!st.is_ok()) {
    // Best effort: the next manager removes leftovers anyway. The original error wins.
    (void)remove_tree(tmp);
  }
  return st;
}

}  // namespace fastpersist::checkpoint
