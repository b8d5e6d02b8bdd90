// SPDX-License-Identifier: Apache-2.0
// Writes one data file for ShardWriter (shard_writer.cc): the safetensors header and the tensors'
// bytes, staged window by window into pinned memory and written by async O_DIRECT requests at their
// offsets. Each tensor's checksum is computed on the staged copy right after it is copied (while
// the bytes are still in cache), so the checksum covers exactly the bytes written.
//
// The file is created (O_EXCL), preallocated to its final size (so ENOSPC shows at once and
// writes never extend it), written, and fdatasynced when durable. On failure every request in
// flight is waited for before returning, so no staging memory is still being written from.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "common/task_pool.h"
#include "common/unique_fd.h"
#include "fastpersist/io_engine.h"
#include "fastpersist/shard_writer.h"
#include "fastpersist/status.h"
#include "fastpersist/tensor_codec.h"
#include "fastpersist/tensor_source.h"
#include "write/shard_plan.h"
#include "write/staging_pool.h"

namespace fastpersist::checkpoint {

struct ShardFileOutcome {
  bool created = false;                // this call created the file (it is this call's to remove)
  uint64_t header = 0;                 // checksum of bytes [0, data_start)
  std::vector<uint64_t> tensors;       // checksums in file order (PlannedFile::tensors)
  std::vector<ContentDigest> digests;  // with ShardWriteArgs::digests: XXH3-128, file order
  double checksum_seconds = 0;         // time spent checksumming (what checksums cost the save)
  // Encoded files only (the plan lays raw files out): where each tensor's stored bytes went, in
  // file order, the file's final size and where its data starts.
  struct Stored {
    uint64_t offset = 0;  // absolute, in the file
    uint64_t length = 0;
    Compression encoding = Compression::kNone;
    bool xor_delta = false;  // "xor-zstd" against the tensor's DeltaSource (encoding kZstd)
  };
  std::vector<Stored> stored;
  uint64_t file_size = 0;
  uint64_t data_start = 0;
  double compress_seconds = 0;  // CPU time of this file's compression tasks
};

struct ShardWriteArgs {
  std::string path;
  const PlannedFile* file = nullptr;
  const std::vector<TensorSource>* sources = nullptr;
  StagingPool* pool = nullptr;
  IoEngine* engine = nullptr;
  const std::atomic<bool>* cancel = nullptr;  // another file of the write failed: stop early
  bool durable = true;
  bool checksums = true;                   // off: tensors' checksums stay 0
  bool digests = false;                    // also XXH3-128 of each tensor (same pass)
  std::function<void()> on_snapshot_done;  // every source byte is staged (called once)
  // Encoded files (PlannedFile::encoded): the codec, its level, and the workers that compress.
  Compression compression = Compression::kNone;
  int compression_level = 0;
  TaskPool* compressors = nullptr;
  // XOR deltas: per source tensor, its base (null, or an entry per source; shard_writer.h).
  const std::vector<std::optional<DeltaSource>>* deltas = nullptr;
};

// Creates the data file at args.path for writing (O_EXCL: never replacing one) and sets
// out->created, so that a failed write removes it. kAlreadyExists for someone else's file
// (another writer of the same rank, a leftover), told apart from an I/O failure. Both writers
// start here.
Result<UniqueFd> create_data_file(const ShardWriteArgs& args, ShardFileOutcome* out);

// A raw file (valid safetensors, laid out by the plan).
Status write_shard_file(const ShardWriteArgs& args, ShardFileOutcome* out);

}  // namespace fastpersist::checkpoint
