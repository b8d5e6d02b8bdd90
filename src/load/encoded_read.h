// SPDX-License-Identifier: Apache-2.0
// Decoding compressed tensors (tensor_codec.h) for the readers (private to src/load and the layers
// above):
//
//  - ParallelDecode: tensors whose stored bytes are in memory, every chunk decoded on a task
//    pool at once (what a load does);
//  - FrameStream: stored bytes fed in file order in pieces of any size, each frame decoded as
//    soon as it is complete, its raw bytes handed on in order; memory stays at one frame and
//    one chunk whatever the tensor's size (what verify and a memory-bounded load do).
//
// An XOR delta ("xor-zstd") decodes like "zstd" and is then XORed with its base's raw bytes
// (delta_base.h), which both take: without a base such a tensor is refused.
//
// Stored bytes are untrusted: every error is kDataLoss naming the tensor, its file and chunk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/task_pool.h"
#include "fastpersist/manifest.h"
#include "fastpersist/status.h"
#include "fastpersist/tensor_codec.h"
#include "load/chunk_table.h"
#include "load/delta_base.h"

namespace fastpersist::checkpoint {

class ParallelDecode {
 public:
  explicit ParallelDecode(TaskPool& pool) : pool_(pool), group_(pool) {}
  // Queues every chunk of `t` (stored bytes at `stored`, raw bytes to `raw`, t.length of
  // them); an XOR delta needs `base` (each chunk reads its base bytes into `raw`, then XORs the
  // decoded frame into them). A table that does not parse is returned at once; decoding errors
  // by wait().
  Status add(const ManifestTensor& t, const std::byte* stored, std::byte* raw,
             std::shared_ptr<const DeltaBaseBytes> base = nullptr);
  // Waits for every queued chunk; the first error.
  Status wait();

 private:
  TaskPool& pool_;
  TaskGroup group_;
  std::mutex mu_;
  Status first_;
};

class FrameStream {
 public:
  // `sink(raw_offset, data, size)` receives the raw bytes in order, one chunk at a time.
  using Sink = std::function<Status(uint64_t offset, const std::byte* data, size_t size)>;
  // An XOR delta needs `base`: each chunk is XORed with its base bytes before the sink sees it.
  FrameStream(const ManifestTensor& t, ChunkTable table, Sink sink,
              std::shared_ptr<const DeltaBaseBytes> base = nullptr);
  // The next `n` stored bytes (bytes past the frames, the table, are skipped).
  Status feed(const std::byte* data, size_t n);
  // After the last byte: kDataLoss when a frame is still incomplete.
  Status finish() const;

 private:
  Status decode_frame();

  const ManifestTensor& t_;
  const ChunkTable table_;
  const size_t width_;
  Sink sink_;
  std::shared_ptr<const DeltaBaseBytes> base_;
  ChunkCodec codec_;
  uint64_t stored_pos_ = 0;  // stored bytes fed so far
  size_t next_chunk_ = 0;
  std::vector<std::byte> frame_;  // the bytes of frame next_chunk_ so far
  std::unique_ptr<std::byte[]> raw_;
  std::unique_ptr<std::byte[]> base_raw_;  // XOR deltas: the base bytes of the chunk
};

}  // namespace fastpersist::checkpoint
