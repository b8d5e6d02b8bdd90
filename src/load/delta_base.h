// SPDX-License-Identifier: Apache-2.0
// The raw bytes of an XOR delta's base (manifest.h, DeltaBase), read on demand, any range:
// straight for a raw base, by decoding the chunks a range covers for a compressed one. Reads
// are O_DIRECT (4096-aligned, through a per-thread buffer) where the filesystem takes them,
// so reading a base neither fills the page cache nor pays for its pages; buffered otherwise.
// Readers (load, read_pieces, verify, a tier's drain) XOR them into the decoded delta; the writer
// XORs them out of the tensor it saves (private to src/load and the layers above).
//
// The base's stored bytes are untrusted like any others: a frame that does not decode, or a
// file that ends early, is kDataLoss naming the tensor and its base.
//
// Thread-safety: read() may be called from any number of threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/regular_file.h"
#include "fastpersist/manifest.h"
#include "fastpersist/status.h"
#include "fastpersist/tensor_codec.h"

namespace fastpersist::checkpoint {

class DeltaBaseBytes {
 public:
  // The base of `delta` (a tensor whose delta_base is set) at `path`, the base file resolved by
  // the caller (resolve_manifest_file: no symbolic links). Reads the chunk table of a
  // compressed base.
  static Result<std::shared_ptr<const DeltaBaseBytes>> open(const ManifestTensor& delta,
                                                            const std::string& path);
  // The base as a tensor of its own (name, dtype and shape of the delta; file, offset, lengths,
  // encoding and checksum of the base): what a writer's record of the base is made from.
  static ManifestTensor base_tensor(const ManifestTensor& delta);

  // Raw bytes [offset, offset + n) of the base into `out`.
  Status read(uint64_t offset, size_t n, std::byte* out) const;
  uint64_t length() const { return base_.length; }
  const std::string& path() const { return path_; }

 private:
  DeltaBaseBytes(ManifestTensor base, std::string path, RegularFile file,
                 std::optional<ChunkTable> table);
  Status pread_exact(std::byte* out, size_t n, uint64_t offset) const;
  Status pread_buffered(std::byte* out, size_t n, uint64_t offset) const;
  Status damaged(const std::string& why) const;

  const ManifestTensor base_;
  const std::string path_;
  const RegularFile file_;
  UniqueFd direct_;  // the same file opened O_DIRECT (invalid: the filesystem refuses it)
  const std::optional<ChunkTable> table_;  // compressed bases
};

}  // namespace fastpersist::checkpoint
