// SPDX-License-Identifier: Apache-2.0
// ShardWriter: tensors in, safetensors data files plus the manifest records that describe them
// out. It is the one write path of fastpersist: CheckpointManager saves through it, and so can
// any process or rank of a distributed job (each with its own ShardWriter), into a directory of
// its choosing. It takes no lock and commits nothing: it creates its files (O_EXCL, never
// replacing one), writes and (when durable) syncs them, and returns the records. Whoever
// commits (the manager's rename, a coordinator writing the manifest) decides what they mean.
//
// Data path (no copy beyond the one into staging): each file is created, preallocated, staged
// window by window into pinned memory (host tensors by memcpy, CUDA tensors by the CUDA runtime)
// with each tensor's XXH3-64 checksum computed on the staged bytes while they are in cache, and
// written by async O_DIRECT requests at their offsets; up to max_parallel_files files at once.
// The staging windows belong to the ShardWriter and are reused by every later write.
//
// File names come from data_file_name (layout.h): with ShardWriterOptions::rank set they carry
// the rank, so writers of different ranks can share one directory at the same time. Two writers
// without ranks (or with the same rank) in one directory collide: the second gets kAlreadyExists
// and leaves the first one's files alone.
//
// On failure a write removes every file it created (and only those): the directory is as it
// was, so a rank can retry into it. The directory itself is never removed.
//
// Thread-safety: all methods may be called from any thread, write() by several at once: the
// concurrent writes share the staging budget (each waits for windows the others release).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fastpersist/io_engine.h"
#include "fastpersist/manifest.h"
#include "fastpersist/options.h"
#include "fastpersist/status.h"
#include "fastpersist/tensor_codec.h"
#include "fastpersist/tensor_source.h"

namespace fastpersist {

// The most threads (or files written at once) a setting may ask for: a bound on a number that
// would otherwise start that many threads.
inline constexpr unsigned kMaxThreadsSetting = 1024;

// How tensors are written into data files: the settings ShardWriter and CheckpointManager share
// (CheckpointOptions derives from this struct, so each default is written once, here).
struct DataFileOptions {
  EngineOptions engine;  // the I/O engine (when the writer creates its own)
  // Pinned staging memory, all writes together; 0 = as much as one write needs (the snapshot
  // then finishes at memory speed, before the writes). A smaller budget streams: the snapshot of
  // a piece waits until an earlier piece is written. A budget below one window lowers the
  // window to it (4096 at least): the budget is never exceeded.
  size_t staging_budget_bytes = 0;
  size_t staging_window_bytes = size_t{64} << 20;  // unit of staging and of one write
  bool lock_staging_memory = true;  // mlock (pinned) staging; false: plain aligned memory
  unsigned max_parallel_files = 4;  // data files written at the same time
  uint64_t target_file_bytes = uint64_t{1} << 30;  // data files hold about this much, at most
  uint64_t min_file_bytes = uint64_t{64} << 20;    // ... and are not split below this
  // fdatasync the files (the manager also fsyncs its directories); off only for tests.
  bool durable = true;
  // Per-tensor XXH3-64 checksums computed while staging (cheap: the bytes are in cache). Off:
  // every checksum in the records is 0 (the manifest then says checksum_algorithm "none").
  bool checksums = true;
  // Also record each non-empty tensor's XXH3-128 (ManifestTensor::digest), from the same pass
  // over the staged bytes as the checksum (xxHash's two widths share one state: no extra
  // cost). The manager turns it on for incremental checkpoints.
  bool content_digests = false;
  // Lossless compression of the tensors' bytes (tensor_codec.h). kNone writes plain
  // safetensors files. With a codec each data file is written as an encoded file: every tensor
  // whose first 4 MiB chunk shrinks by 5% or more is stored compressed, chunk by chunk, on
  // compression_threads worker threads, and the others raw (docs/format.md, "Compressed
  // tensors"). The snapshot is unchanged (the one copy into staging); compressing follows it.
  Compression compression = Compression::kNone;
  std::optional<int> compression_level;  // nullopt: default_compression_level()
  unsigned compression_threads = 0;      // 0: one per core

  // kInvalidArgument when staging_window_bytes is not a positive multiple of 4096, the budget
  // is neither 0 nor at least 4096, max_parallel_files is not 1 to kMaxThreadsSetting,
  // compression_threads is over kMaxThreadsSetting, or a compression level is given without a
  // codec or outside the codec's range.
  Status validate() const;
  // The window in force: staging_window_bytes, lowered to a smaller nonzero budget (rounded
  // down to 4096).
  size_t effective_window_bytes() const;
  // The compression level in force (compression_level or the codec's default).
  int effective_compression_level() const;
};

struct ShardWriterOptions : DataFileOptions {
  // The rank of a distributed job: it goes into every file name and ManifestFile::rank.
  // nullopt: a single writer (names without a rank, rank unset in the records).
  std::optional<uint32_t> rank;
};

// What one write produced: the records a manifest needs for its data files.
struct ShardWriteResult {
  // One per data file, in file-name order: role "tensors", its size, the checksum of its
  // safetensors header (bytes [0, checksum_bytes)), and the writer's rank.
  std::vector<ManifestFile> files;
  // One per tensor, in the order of the input: its encoding ("raw" without compression, where
  // stored_length == length), `offset` absolute in `file`, checksum of the raw bytes (0
  // without checksums).
  std::vector<ManifestTensor> tensors;
  uint64_t bytes_written = 0;   // all files
  double checksum_seconds = 0;  // CPU time spent checksumming (overlaps the writes)
  double compress_seconds = 0;  // CPU time spent compressing, all worker threads together
};

// XOR deltas (docs/incremental.md, "XOR deltas"): where the bytes of one tensor's previous
// version lie, in a committed checkpoint. A write planned with these stores a float tensor
// (F16, BF16, F32, F64) as the byte-grouped, zstd-compressed XOR of its bytes with the base's
// ("xor-zstd", ManifestTensor::delta_base) when its first chunk comes out smaller that way than
// compressed alone (or than raw, by 5%, without compression); otherwise as it would be stored
// without a base. The base's bytes are read (and decoded) from `path` while compressing.
struct DeltaSource {
  std::string path;  // the base's data file, resolved (no symbolic links on its way)
  DeltaBase base;    // what the manifest records: `file` as the manifest names it
};

// A checked plan of which tensor goes into which data file at which offset (opaque).
// Planning validates the tensors' descriptions without touching their bytes, so a caller can
// reject a bad request at once and write it later (CheckpointManager plans in save_async and
// writes on its background thread). A plan belongs to the tensor list it was made from.
class ShardPlan {
 public:
  ShardPlan();
  ~ShardPlan();
  ShardPlan(ShardPlan&&) noexcept;
  ShardPlan& operator=(ShardPlan&&) noexcept;
  size_t file_count() const;
  // All data files together, headers included (with compression: the most they can take).
  uint64_t total_bytes() const;
  std::vector<std::string> file_names() const;

  struct Files;

 private:
  friend class ShardWriter;
  std::unique_ptr<Files> files_;
};

struct ShardWriteCallbacks {
  // Called once, from a writer thread, as soon as every source byte is staged: the caller may
  // modify or free its tensors from then on (the write itself may still be running). Not called
  // when the write fails before that; called at the end of a write of no tensors.
  std::function<void()> on_snapshot_done;
};

class ShardWriter {
 public:
  // A writer with its own engine (created from options.engine), or sharing `engine` (options.
  // engine is then ignored). kInvalidArgument for bad staging options (DataFileOptions::validate).
  static Result<std::unique_ptr<ShardWriter>> create(const ShardWriterOptions& options,
                                                     std::shared_ptr<IoEngine> engine = nullptr);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Checks the tensors (non-empty, unique names not starting with "__", known dtypes, nbytes ==
  // product(shape) x dtype size, data present, CUDA available for device tensors) and plans the
  // data files: about target_file_bytes each at most and, for enough bytes, max_parallel_files
  // of at least min_file_bytes so they are written in parallel; no tensors, no files.
  // kInvalidArgument names the offending tensor (kUnavailable: a device tensor without CUDA).
  Result<ShardPlan> plan(const std::vector<TensorSource>& tensors) const;
  // The same, with an XOR delta base for some tensors (`deltas[i]` for tensors[i]; the list is
  // as long as `tensors`): the files that hold one are encoded even without compression.
  // kInvalidArgument for a base on a tensor that is not a float, or of another length, or whose
  // encoding is not raw, zstd or lz4.
  Result<ShardPlan> plan(const std::vector<TensorSource>& tensors,
                         const std::vector<std::optional<DeltaSource>>& deltas) const;

  // Writes `tensors` into new files in `directory` (which must exist) following `plan`, made by
  // plan() from the same list (kInvalidArgument when the list does not match it). The source
  // memory must stay unchanged until on_snapshot_done. With `durable`, when it returns OK every
  // file's data is on stable storage (fdatasync); their names in `directory` become durable
  // when the committer fsyncs `directory`, which it does anyway after writing its own commit
  // record there (one fsync covers every rank's entries). On failure it returns the first error
  // (errno, path, range) after removing the files it created.
  Result<ShardWriteResult> write(const std::string& directory,
                                 const std::vector<TensorSource>& tensors, const ShardPlan& plan,
                                 const ShardWriteCallbacks& callbacks = {});
  // plan() + write().
  Result<ShardWriteResult> write(const std::string& directory,
                                 const std::vector<TensorSource>& tensors,
                                 const ShardWriteCallbacks& callbacks = {});

  // The options in force (staging_window_bytes as effective_window_bytes()).
  const ShardWriterOptions& options() const;
  IoEngine& engine();
  // Staging memory allocated now: kept for reuse by later writes, at most the budget.
  size_t staging_bytes() const;
  // Frees the staging windows not in use (a later write allocates them again).
  void release_staging();

  struct Impl;

 private:
  explicit ShardWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fastpersist
