// SPDX-License-Identifier: Apache-2.0
// Writes one encoded data file for ShardWriter (shard_writer.cc) when compression is on
// (tensor_codec.h, docs/format.md "Compressed tensors").
//
// The file is a safetensors file whose compressed tensors appear as 1-D U8 entries holding
// their stored bytes (frames + chunk table) and whose raw tensors keep their dtype and shape;
// its __metadata__ says "fastpersist.encoding". Since stored sizes are known only once the
// tensors are compressed, the data is written first, from `encoded_header_bytes` on (room the
// plan reserved), and the header last, padded to fill that room.
//
// Pipeline, on the file's writer thread plus the compression workers:
//   snapshot:  source -> staging windows (the one copy, hashed as it is copied, as for raw
//              files), in chunks of 4 MiB that never cross a tensor; as fast as windows are
//              free, so with an unbounded budget the snapshot ends before compression starts
//              (save_async's blocking time does not grow);
//   compress:  a bounded number of chunks ahead, on the workers (byte grouping + one frame);
//   emit:      in file order, each chunk's frame (or raw bytes) appended to an output stream
//              of aligned buffers written by the engine; a window goes back to the pool once
//              its last chunk is emitted.
// A tensor is stored compressed when its first chunk shrinks by 5% or more, and raw otherwise
// (its later chunks are then not compressed at all); tensors under 64 KiB are stored raw.
#pragma once

#include "write/shard_file_writer.h"

namespace fastpersist::checkpoint {

// Tensors smaller than this are stored raw (a frame and a table would be most of them).
inline constexpr uint64_t kMinEncodedTensorBytes = uint64_t{64} << 10;

// Writes the encoded file `args.file` (PlannedFile::encoded). On failure every compression
// task and request in flight has finished before it returns.
Status write_encoded_file(const ShardWriteArgs& args, ShardFileOutcome* out);

}  // namespace fastpersist::checkpoint
