// SPDX-License-Identifier: Apache-2.0
// ShardWriter: plans, writes the data files in parallel (shard_file_writer.cc does one file),
// and turns the outcome into manifest records. On failure it removes the files it created.
#include "fastpersist/shard_writer.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "checkpoint_dir/checkpoint_fs.h"
#include "common/task_pool.h"
#include "fastpersist/dtype.h"
#include "write/encoded_file_writer.h"
#include "write/shard_file_writer.h"
#include "write/shard_plan.h"
#include "write/staging_pool.h"

namespace fastpersist {
namespace {
constexpr size_t kStagingAlignment = 4096;  // O_DIRECT: windows and writes are whole blocks
}  // namespace

Status DataFileOptions::validate() const {
  if (staging_window_bytes < kStagingAlignment || staging_window_bytes % kStagingAlignment != 0) {
    return Status(StatusCode::kInvalidArgument,
                  "staging_window_bytes must be a positive multiple of 4096");
  }
  if (staging_budget_bytes != 0 && staging_budget_bytes < kStagingAlignment) {
    return Status(StatusCode::kInvalidArgument,
                  "staging_budget_bytes must be 0 (unbounded) or at least 4096, got " +
                      std::to_string(staging_budget_bytes));
  }
  if (max_parallel_files < 1 || max_parallel_files > kMaxThreadsSetting) {
    return Status(StatusCode::kInvalidArgument, "max_parallel_files must be 1 to " +
                                                    std::to_string(kMaxThreadsSetting) + ", got " +
                                                    std::to_string(max_parallel_files));
  }
  if (compression_threads > kMaxThreadsSetting) {
    return Status(StatusCode::kInvalidArgument, "compression_threads must be 0 (one per core) to " +
                                                    std::to_string(kMaxThreadsSetting) + ", got " +
                                                    std::to_string(compression_threads));
  }
  if (compression == Compression::kNone && compression_level) {
    return Status(StatusCode::kInvalidArgument,
                  "compression_level " + std::to_string(*compression_level) +
                      " was given without a compression codec: set compression to zstd or lz4, or "
                      "drop the level");
  }
  if (compression != Compression::kNone) {
    FP_RETURN_IF_ERROR(check_compression_level(compression, effective_compression_level()));
  }
  return Status::ok();
}

int DataFileOptions::effective_compression_level() const {
  return compression_level.value_or(default_compression_level(compression));
}

size_t DataFileOptions::effective_window_bytes() const {
  // The budget is a cap: a budget below one window shrinks the window rather than exceed it.
  if (staging_budget_bytes != 0 && staging_budget_bytes < staging_window_bytes) {
    return staging_budget_bytes / kStagingAlignment * kStagingAlignment;
  }
  return staging_window_bytes;
}

struct ShardPlan::Files {
  std::vector<checkpoint::PlannedFile> files;
  size_t tensor_count = 0;
  std::vector<std::optional<DeltaSource>> deltas;  // empty, or one per tensor
};

ShardPlan::ShardPlan() = default;
ShardPlan::~ShardPlan() = default;
ShardPlan::ShardPlan(ShardPlan&&) noexcept = default;
ShardPlan& ShardPlan::operator=(ShardPlan&&) noexcept = default;

size_t ShardPlan::file_count() const { return files_ ? files_->files.size() : 0; }

uint64_t ShardPlan::total_bytes() const {
  uint64_t total = 0;
  if (files_) {
    for (const auto& f : files_->files) total += f.size;
  }
  return total;
}

std::vector<std::string> ShardPlan::file_names() const {
  std::vector<std::string> names;
  if (files_) {
    for (const auto& f : files_->files) names.push_back(f.name);
  }
  return names;
}

struct ShardWriter::Impl {
  Impl(const ShardWriterOptions& o, std::shared_ptr<IoEngine> e)
      : options(o),
        engine(std::move(e)),
        pool(o.staging_window_bytes, o.staging_budget_bytes, o.lock_staging_memory) {}

  const ShardWriterOptions options;
  std::shared_ptr<IoEngine> engine;
  checkpoint::StagingPool pool;
};

namespace {

using checkpoint::PlannedFile;
using checkpoint::ShardFileOutcome;

// The plan must describe exactly these tensors: same count, and each planned slot holds a tensor
// of the planned name and size (the data pointers may have changed since planning).
Status check_plan_matches(const ShardPlan::Files& plan, const std::vector<TensorSource>& tensors) {
  if (plan.tensor_count != tensors.size()) {
    return Status(StatusCode::kInvalidArgument,
                  "the plan was made for " + std::to_string(plan.tensor_count) +
                      " tensors, the write has " + std::to_string(tensors.size()));
  }
  for (const PlannedFile& file : plan.files) {
    for (size_t k = 0; k < file.tensors.size(); ++k) {
      const TensorSource& t = tensors[file.tensors[k]];
      const SafetensorsTensor& planned = file.layout.tensors[k];
      if (t.name != planned.name || t.dtype != planned.dtype || t.nbytes != planned.nbytes()) {
        return Status(StatusCode::kInvalidArgument,
                      "tensor '" + t.name + "' does not match the plan (made for '" + planned.name +
                          "', " + planned.dtype + ", " + std::to_string(planned.nbytes()) +
                          " bytes)");
      }
      if (t.nbytes > 0 && t.data == nullptr) {
        return Status(StatusCode::kInvalidArgument, "tensor '" + t.name + "': no data");
      }
    }
  }
  return Status::ok();
}

// Up to max_parallel_files files at a time (never more threads than the budget has window
// pairs, so each file keeps one window staging while another is written).
Status write_files(const std::string& directory, const std::vector<PlannedFile>& files,
                   const std::vector<TensorSource>& tensors, const DataFileOptions& options,
                   checkpoint::StagingPool& pool, IoEngine& engine,
                   const std::function<void()>& on_snapshot_done,
                   const std::vector<std::optional<DeltaSource>>& deltas,
                   std::vector<ShardFileOutcome>* outcomes) {
  outcomes->assign(files.size(), {});
  std::atomic<bool> cancel{false};
  std::atomic<size_t> next{0};
  std::atomic<size_t> snapshots_left{files.size()};
  std::mutex mu;
  Status first;
  auto on_file_staged = [&] {
    if (snapshots_left.fetch_sub(1) == 1 && on_snapshot_done) on_snapshot_done();
  };
  // Compressing workers, for this write only (joined when it ends).
  const bool encoded =
      std::any_of(files.begin(), files.end(), [](const PlannedFile& f) { return f.encoded; });
  std::unique_ptr<TaskPool> compressors;
  if (encoded) {
    uint64_t chunks = 0;
    for (const TensorSource& t : tensors) chunks += chunk_count(t.nbytes, kCodecChunkBytes);
    compressors = std::make_unique<TaskPool>(
        TaskPool::choose_threads(options.compression_threads, static_cast<size_t>(chunks)));
  }
  auto worker = [&] {
    for (size_t i = next.fetch_add(1); i < files.size(); i = next.fetch_add(1)) {
      checkpoint::ShardWriteArgs args;
      args.path = checkpoint::join_path(directory, files[i].name);
      args.file = &files[i];
      args.sources = &tensors;
      args.pool = &pool;
      args.engine = &engine;
      args.cancel = &cancel;
      args.durable = options.durable;
      args.checksums = options.checksums;
      args.digests = options.content_digests;
      args.on_snapshot_done = on_file_staged;
      args.compression = options.compression;
      args.compression_level = options.effective_compression_level();
      args.compressors = compressors.get();
      args.deltas = deltas.empty() ? nullptr : &deltas;
      Status st = files[i].encoded ? checkpoint::write_encoded_file(args, &(*outcomes)[i])
                                   : checkpoint::write_shard_file(args, &(*outcomes)[i]);
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
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < threads; ++t) helpers.emplace_back(worker);
  worker();
  for (auto& t : helpers) t.join();
  if (files.empty() && on_snapshot_done) on_snapshot_done();
  return first;
}

ShardWriteResult make_records(const std::vector<PlannedFile>& files,
                              const std::vector<TensorSource>& tensors,
                              const std::vector<ShardFileOutcome>& outcomes,
                              const std::vector<std::optional<DeltaSource>>& deltas,
                              std::optional<uint32_t> rank) {
  ShardWriteResult r;
  r.files.reserve(files.size());
  r.tensors.resize(tensors.size());
  for (size_t f = 0; f < files.size(); ++f) {
    const PlannedFile& file = files[f];
    const ShardFileOutcome& outcome = outcomes[f];
    ManifestFile data;
    data.name = file.name;
    data.role = "tensors";
    data.size = file.encoded ? outcome.file_size : file.size;
    data.checksum = outcome.header;
    data.checksum_bytes = file.encoded ? outcome.data_start : file.layout.data_start;
    data.rank = rank;
    r.bytes_written += data.size;
    r.files.push_back(std::move(data));
    r.checksum_seconds += outcome.checksum_seconds;
    r.compress_seconds += outcome.compress_seconds;
    for (size_t k = 0; k < file.tensors.size(); ++k) {
      const TensorSource& t = tensors[file.tensors[k]];
      const SafetensorsTensor& at = file.layout.tensors[k];
      ManifestTensor& mt = r.tensors[file.tensors[k]];  // the caller's order
      mt.name = t.name;
      mt.dtype = t.dtype;
      mt.shape = t.shape;
      mt.file = file.name;
      mt.length = at.nbytes();
      if (file.encoded) {
        const ShardFileOutcome::Stored& stored = outcome.stored[k];
        mt.offset = stored.offset;
        mt.encoding =
            std::string(stored.xor_delta ? kEncodingXorZstd : encoding_of(stored.encoding));
        mt.stored_length = stored.length;
        if (stored.xor_delta) mt.delta_base = deltas[file.tensors[k]]->base;
      } else {
        mt.offset = file.layout.data_start + at.begin;
        mt.encoding = std::string(kEncodingRaw);
        mt.stored_length = mt.length;
      }
      mt.checksum = outcome.tensors[k];
      // Empty tensors have no bytes to tell apart: no digest (incremental.h).
      if (k < outcome.digests.size() && t.nbytes > 0) mt.digest = outcome.digests[k];
    }
  }
  return r;
}

}  // namespace

Result<std::unique_ptr<ShardWriter>> ShardWriter::create(const ShardWriterOptions& options,
                                                         std::shared_ptr<IoEngine> engine) {
  FP_RETURN_IF_ERROR(options.validate());
  ShardWriterOptions effective = options;
  effective.staging_window_bytes = options.effective_window_bytes();
  if (!engine) {
    FP_ASSIGN_OR_RETURN(auto own, IoEngine::create(options.engine));
    engine = std::move(own);
  }
  return std::unique_ptr<ShardWriter>(
      new ShardWriter(std::make_unique<Impl>(effective, std::move(engine))));
}

ShardWriter::ShardWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShardWriter::~ShardWriter() = default;

Result<ShardPlan> ShardWriter::plan(const std::vector<TensorSource>& tensors) const {
  return plan(tensors, {});
}

Result<ShardPlan> ShardWriter::plan(const std::vector<TensorSource>& tensors,
                                    const std::vector<std::optional<DeltaSource>>& deltas) const {
  if (!deltas.empty()) {
    if (deltas.size() != tensors.size()) {
      return Status(StatusCode::kInvalidArgument,
                    "the write has " + std::to_string(tensors.size()) + " tensors but " +
                        std::to_string(deltas.size()) + " delta bases");
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!deltas[i]) continue;
      const DtypeInfo* dtype = find_dtype(tensors[i].dtype);
      const DeltaBase& b = deltas[i]->base;
      if (dtype == nullptr || dtype->kind != DtypeKind::kFloat) {
        return Status(
            StatusCode::kInvalidArgument,
            "tensor '" + tensors[i].name + "': XOR deltas are for floats, not " + tensors[i].dtype);
      }
      if (!compression_of_encoding(b.encoding) ||
          (b.encoding == kEncodingRaw && b.stored_length != tensors[i].nbytes)) {
        return Status(StatusCode::kInvalidArgument,
                      "tensor '" + tensors[i].name +
                          "': its delta base is not a raw, zstd or lz4 tensor of its size");
      }
    }
  }
  auto files = std::make_unique<ShardPlan::Files>();
  FP_ASSIGN_OR_RETURN(files->files,
                      checkpoint::plan_files(tensors, impl_->options, impl_->options.rank, deltas));
  files->tensor_count = tensors.size();
  files->deltas = deltas;
  ShardPlan plan;
  plan.files_ = std::move(files);
  return plan;
}

Result<ShardWriteResult> ShardWriter::write(const std::string& directory,
                                            const std::vector<TensorSource>& tensors,
                                            const ShardPlan& plan,
                                            const ShardWriteCallbacks& callbacks) {
  if (!plan.files_) {
    return Status(StatusCode::kInvalidArgument, "the shard plan is empty (moved from?)");
  }
  FP_RETURN_IF_ERROR(check_plan_matches(*plan.files_, tensors));
  const std::vector<PlannedFile>& files = plan.files_->files;
  std::vector<ShardFileOutcome> outcomes;
  Status st = write_files(directory, files, tensors, impl_->options, impl_->pool, *impl_->engine,
                          callbacks.on_snapshot_done, plan.files_->deltas, &outcomes);
  if (!st.is_ok()) {
    // Only what this write created: a name taken by someone else (EEXIST) stays theirs.
    for (size_t f = 0; f < files.size(); ++f) {
      if (outcomes[f].created) {
        (void)::unlink(checkpoint::join_path(directory, files[f].name).c_str());
      }
    }
    return st;
  }
  return make_records(files, tensors, outcomes, plan.files_->deltas, impl_->options.rank);
}

Result<ShardWriteResult> ShardWriter::write(const std::string& directory,
                                            const std::vector<TensorSource>& tensors,
                                            const ShardWriteCallbacks& callbacks) {
  FP_ASSIGN_OR_RETURN(ShardPlan p, plan(tensors));
  return write(directory, tensors, p, callbacks);
}

const ShardWriterOptions& ShardWriter::options() const { return impl_->options; }
IoEngine& ShardWriter::engine() { return *impl_->engine; }
size_t ShardWriter::staging_bytes() const { return impl_->pool.allocated_bytes(); }
void ShardWriter::release_staging() { impl_->pool.trim(); }

}  // namespace fastpersist
