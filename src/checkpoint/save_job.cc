// SPDX-License-Identifier: Apache-2.0
// The commit protocol of one checkpoint; the numbered steps are those of save_job.h.
#include "checkpoint/save_job.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_fs.h"
#include "checkpoint/shard_plan.h"
#include "checkpoint/shard_writer.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/checksum.h"
#include "fastpersist/manifest.h"

namespace fastpersist::checkpoint {
namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Step 2: every data file, up to max_parallel_files at a time. Returns the checksums per file.
Status write_data_files(const SaveJob& job, const std::string& dir,
                        const std::vector<PlannedFile>& files, const CheckpointOptions& options,
                        StagingPool& pool, IoEngine& engine, std::vector<ShardChecksums>* sums) {
  sums->assign(files.size(), {});
  std::atomic<bool> cancel{false};
  std::atomic<size_t> next{0};
  std::atomic<size_t> snapshots_left{files.size()};
  std::mutex mu;
  Status first;
  auto on_snapshot = [&] {
    if (snapshots_left.fetch_sub(1) == 1) job.state->mark_snapshot_done();
  };
  auto worker = [&] {
    for (size_t i = next.fetch_add(1); i < files.size(); i = next.fetch_add(1)) {
      ShardWriteArgs args;
      args.path = join_path(dir, files[i].name);
      args.file = &files[i];
      args.sources = &job.content.tensors;
      args.pool = &pool;
      args.engine = &engine;
      args.cancel = &cancel;
      args.durable = options.durable;
      args.checksums = options.checksums;
      args.on_snapshot_done = on_snapshot;
      Status st = write_shard(args, &(*sums)[i]);
      if (!st.is_ok()) {
        std::lock_guard lock(mu);
        // The first real failure wins over the "cancelled" of the files it stopped.
        if (first.is_ok() || (first.code() == StatusCode::kInternal && !cancel.load())) first = st;
        cancel.store(true);
      }
    }
  };
  size_t threads = std::min<size_t>({files.size(), std::max(options.max_parallel_files, 1u),
                                     std::max<size_t>(pool.max_windows() / 2, 1)});
  std::vector<std::thread> pool_threads;
  for (size_t t = 1; t < threads; ++t) pool_threads.emplace_back(worker);
  worker();
  for (auto& t : pool_threads) t.join();
  if (files.empty()) job.state->mark_snapshot_done();
  return first;
}

Manifest build_manifest(const SaveJob& job, const std::vector<PlannedFile>& files,
                        const std::vector<ShardChecksums>& sums, uint64_t objects_checksum) {
  const CheckpointContent& c = job.content;
  Manifest m;
  m.tag = job.tag;
  m.step = c.step;
  m.sequence = job.sequence;
  m.versions = c.versions;
  m.versions["fastpersist"] = FASTPERSIST_VERSION;
  m.metadata_json = c.metadata_json;
  m.aliases = c.aliases;
  for (size_t f = 0; f < files.size(); ++f) {
    const PlannedFile& file = files[f];
    ManifestFile data;
    data.name = file.name;
    data.role = "tensors";
    data.size = file.size;
    data.checksum = sums[f].header;
    data.checksum_bytes = file.layout.data_start;
    m.files.push_back(std::move(data));
    for (size_t k = 0; k < file.tensors.size(); ++k) {
      const TensorSource& t = c.tensors[file.tensors[k]];
      const SafetensorsTensor& at = file.layout.tensors[k];
      ManifestTensor mt;
      mt.name = t.name;
      mt.dtype = t.dtype;
      mt.shape = t.shape;
      mt.file = file.name;
      mt.offset = file.layout.data_start + at.begin;
      mt.length = at.nbytes();
      mt.stored_length = mt.length;
      mt.checksum = sums[f].tensors[k];
      m.tensors.push_back(std::move(mt));
    }
  }
  ManifestFile objects;
  objects.name = std::string(kObjectsFileName);
  objects.role = "objects";
  objects.size = c.objects.size();
  objects.checksum = objects_checksum;
  objects.checksum_bytes = c.objects.size();
  m.files.push_back(std::move(objects));
  // Keep the caller's tensor order in the manifest (it is the order a loader reports).
  std::unordered_map<std::string, size_t> pos;
  for (size_t i = 0; i < c.tensors.size(); ++i) pos[c.tensors[i].name] = i;
  std::stable_sort(m.tensors.begin(), m.tensors.end(),
                   [&](const ManifestTensor& a, const ManifestTensor& b) {
                     return pos[a.name] < pos[b.name];
                   });
  m.fingerprint = manifest_fingerprint(m.tensors);
  m.created_unix = unix_now();
  return m;
}

Status check_aliases(const CheckpointContent& c) {
  for (const auto& [alias, target] : c.aliases) {
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
                 StagingPool& pool, IoEngine& engine, uint64_t* bytes_written) {
  const std::vector<PlannedFile>& files = job.files;

  // 1.
  if (::mkdir(tmp.c_str(), 0755) != 0) {
    return Status::from_errno(errno, "cannot create the checkpoint's temporary directory").with_path(tmp);
  }
  // 2.
  std::vector<ShardChecksums> sums;
  FP_RETURN_IF_ERROR(write_data_files(job, tmp, files, options, pool, engine, &sums));
  {
    double seconds = 0;
    for (const ShardChecksums& s : sums) seconds += s.checksum_seconds;
    std::lock_guard lock(job.state->mu);
    job.state->checksum_seconds = seconds;
  }
  // 3.
  const std::string& objects = job.content.objects;
  FP_RETURN_IF_ERROR(write_new_file(join_path(tmp, kObjectsFileName), objects, options.durable));
  uint64_t objects_sum = options.checksums ? xxh3_64(objects.data(), objects.size()) : 0;
  Manifest manifest = build_manifest(job, files, sums, objects_sum);
  if (!options.checksums) manifest.checksum_algorithm = std::string(kNoChecksum);
  std::string manifest_text = encode_manifest(manifest);
  FP_RETURN_IF_ERROR(write_new_file(join_path(tmp, kManifestFileName), manifest_text, options.durable));
  if (options.durable) FP_RETURN_IF_ERROR(fsync_dir(tmp));
  // 4.
  std::unique_lock<std::mutex> pointer_lock;
  if (job.pointer_mu != nullptr) pointer_lock = std::unique_lock(*job.pointer_mu);
  std::string target = join_path(job.root, job.tag);
  Status renamed = rename_no_replace(tmp, target);
  if (renamed.code() == StatusCode::kAlreadyExists) {
    return Status(StatusCode::kAlreadyExists,
                  "checkpoint '" + job.tag + "' already exists; choose another tag or remove it")
        .with_path(target);
  }
  FP_RETURN_IF_ERROR(renamed);
  if (options.durable) FP_RETURN_IF_ERROR(fsync_dir(job.root));
  // 5. If the pointer cannot be written (ENOSPC), step 4 is undone: an error from a save always
  // means that nothing was committed.
  Status pointer = replace_file_atomically(join_path(job.root, kLatestFileName), job.tag + "\n",
                                           options.durable);
  if (!pointer.is_ok()) {
    std::string trash = join_path(job.root, std::string(kTrashDirPrefix) + job.tag + "-" + unique_suffix());
    bool undone = ::rename(target.c_str(), trash.c_str()) == 0;
    if (undone) {
      if (options.durable) (void)fsync_dir(job.root);
      (void)remove_tree(trash);
    }
    return Status(pointer.code(),
                  "cannot update the 'latest' pointer (" + pointer.message() + "); checkpoint '" +
                      job.tag + (undone ? "' was therefore not kept" : "' stays committed"),
                  pointer.sys_errno())
        .with_path(pointer.path());
  }
  uint64_t total = objects.size() + manifest_text.size();
  for (const PlannedFile& f : files) total += f.size;
  *bytes_written = total;
  return Status::ok();
}

}  // namespace

Result<std::vector<PlannedFile>> plan_content(const CheckpointContent& content,
                                              const CheckpointOptions& options) {
  auto metadata = nlohmann::json::parse(content.metadata_json, nullptr, /*allow_exceptions=*/false);
  if (metadata.is_discarded() || !metadata.is_object()) {
    return Status(StatusCode::kInvalidArgument, "checkpoint metadata must be a JSON object");
  }
  FP_RETURN_IF_ERROR(check_aliases(content));
  return plan_files(content.tensors, options);
}

Status run_save_job(const SaveJob& job, const CheckpointOptions& options, StagingPool& pool,
                    IoEngine& engine, uint64_t* bytes_written) {
  *bytes_written = 0;
  std::string tmp = join_path(job.root, std::string(kTempDirPrefix) + job.tag + "-" + unique_suffix());
  Status st = run_steps(job, tmp, options, pool, engine, bytes_written);
  if (!st.is_ok()) {
    // Best effort: the next manager removes leftovers anyway. The original error wins.
    (void)remove_tree(tmp);
  }
  return st;
}

}  // namespace fastpersist::checkpoint
