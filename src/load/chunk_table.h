// SPDX-License-Identifier: Apache-2.0
// The stored form of an encoded tensor, for the readers (private to src/load and the layers
// above): its codec and element width, its place in messages, and its chunk table, read from
// the end of its stored bytes in a file or in memory. The decoders (encoded_read.h) and an XOR
// delta's base (delta_base.h) both start here; neither needs the other for it.
//
// Stored bytes are untrusted: every error is kDataLoss naming the tensor and its file.
#pragma once

#include <cstddef>
#include <string>

#include "fastpersist/manifest.h"
#include "fastpersist/status.h"
#include "fastpersist/tensor_codec.h"

namespace fastpersist::checkpoint {

// The codec and element width of an encoded tensor (kUnavailable for an unknown encoding).
struct EncodedTensor {
  Compression compression = Compression::kNone;
  size_t width = 1;
  bool xor_delta = false;  // "xor-zstd": the frames hold the XOR with the base
};
Result<EncodedTensor> encoded_tensor(const ManifestTensor& t);

// "tensor 'x' in tensors-00000-of-00001.safetensors" (for messages).
std::string tensor_place(const ManifestTensor& t);

// The chunk table of `t`, read from the end of its stored bytes in the file at `path` (two
// small reads).
Result<ChunkTable> read_chunk_table(const std::string& path, const ManifestTensor& t);
// ... or from its stored bytes in memory.
Result<ChunkTable> chunk_table_in_memory(const ManifestTensor& t, const std::byte* stored);

}  // namespace fastpersist::checkpoint
