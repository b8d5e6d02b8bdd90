// SPDX-License-Identifier: Apache-2.0
// See chunk_table.h.
#include "load/chunk_table.h"

#include <unistd.h>

#include <cerrno>
#include <optional>
#include <vector>

#include "common/printable.h"
#include "common/regular_file.h"
#include "fastpersist/safetensors.h"

namespace fastpersist::checkpoint {
namespace {

Status pread_exact(int fd, std::byte* out, size_t n, uint64_t offset, const std::string& path) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(fd, out + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::from_errno(errno, "cannot read a chunk table").with_path(path);
    if (r == 0)
      return Status(StatusCode::kDataLoss, "the data file ends inside a chunk table")
          .with_path(path);
    done += static_cast<size_t>(r);
  }
  return Status::ok();
}

}  // namespace

std::string tensor_place(const ManifestTensor& t) {
  return "tensor '" + printable(t.name) + "' in " + printable(t.file);
}

Result<EncodedTensor> encoded_tensor(const ManifestTensor& t) {
  const bool xor_delta = t.encoding == kEncodingXorZstd;
  std::optional<Compression> c =
      xor_delta ? Compression::kZstd : compression_of_encoding(t.encoding);
  if (!c || (xor_delta && !t.delta_base)) {
    Status st = check_encoding_supported(t);
    return st.is_ok()
               ? Status(StatusCode::kInternal, tensor_place(t) + ": encoding without a codec")
               : st;
  }
  std::optional<size_t> width = safetensors_dtype_size(t.dtype);
  if (!width) return Status(StatusCode::kDataLoss, tensor_place(t) + " has an unknown dtype");
  return EncodedTensor{*c, *width, xor_delta};
}

Result<ChunkTable> chunk_table_in_memory(const ManifestTensor& t, const std::byte* stored) {
  FP_ASSIGN_OR_RETURN(EncodedTensor e, encoded_tensor(t));
  const std::string what = tensor_place(t);
  if (t.stored_length < kChunkTableTrailerBytes) {
    return Status(StatusCode::kDataLoss,
                  what + ": too short to hold a chunk table: the checkpoint is damaged");
  }
  Result<uint64_t> table_bytes =
      chunk_table_size(stored + t.stored_length - kChunkTableTrailerBytes, t.stored_length);
  if (!table_bytes.is_ok()) {
    return Status(StatusCode::kDataLoss,
                  what + ": " + table_bytes.status().message() + ": the checkpoint is damaged");
  }
  return parse_chunk_table(stored + t.stored_length - *table_bytes, *table_bytes, e.compression,
                           e.width, t.length, t.stored_length, what);
}

Result<ChunkTable> read_chunk_table(const std::string& path, const ManifestTensor& t) {
  FP_ASSIGN_OR_RETURN(EncodedTensor e, encoded_tensor(t));
  const std::string what = tensor_place(t);
  if (t.stored_length < kChunkTableTrailerBytes) {
    return Status(StatusCode::kDataLoss,
                  what + ": too short to hold a chunk table: the checkpoint is damaged")
        .with_path(path);
  }
  FP_ASSIGN_OR_RETURN(RegularFile file,
                      open_regular_file(path, Symlinks::kRefuse, "checkpoint file"));
  std::byte trailer[kChunkTableTrailerBytes];
  const uint64_t end = t.offset + t.stored_length;
  FP_RETURN_IF_ERROR(
      pread_exact(file.fd.get(), trailer, sizeof(trailer), end - sizeof(trailer), path));
  Result<uint64_t> table_bytes = chunk_table_size(trailer, t.stored_length);
  if (!table_bytes.is_ok()) {
    return Status(StatusCode::kDataLoss,
                  what + ": " + table_bytes.status().message() + ": the checkpoint is damaged")
        .with_path(path);
  }
  // At most 4 bytes per chunk of at least 1 byte of stored data: bounded by the file.
  std::vector<std::byte> table(static_cast<size_t>(*table_bytes));
  FP_RETURN_IF_ERROR(
      pread_exact(file.fd.get(), table.data(), table.size(), end - *table_bytes, path));
  Result<ChunkTable> parsed = parse_chunk_table(table.data(), *table_bytes, e.compression, e.width,
                                                t.length, t.stored_length, what);
  if (!parsed.is_ok()) return Status(parsed.status()).with_path(path);
  return parsed;
}

}  // namespace fastpersist::checkpoint
