// SPDX-License-Identifier: Apache-2.0
// The safetensors file format (https://github.com/huggingface/safetensors): reader and writer of
// its header. The format is specified in docs/format.md; in short:
//
//   [8 bytes: N, little-endian u64][N bytes: UTF-8 JSON header][data section]
//   header = {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//             "__metadata__": {"<key>": "<string>", ...}}     (offsets relative to the data)
//
// Rules enforced on read (those of the reference reader): N <= 100 MB, valid JSON object, known
// dtype, no duplicate names, end - begin == product(shape) * dtype size, the tensors cover the
// data section exactly (sorted by begin, each begins where the previous ended, no holes, no
// overlaps), and the file is exactly 8 + N + data bytes long.
//
// fastpersist's writer pads the JSON with spaces (allowed by the format) so that the data
// section starts on an `alignment` boundary (4096 by default), which lets O_DIRECT and GDS read
// the data straight into aligned memory. Tensors follow each other without gaps; the caller
// chooses their order (fastpersist puts wider dtypes first so every tensor is aligned to its
// element size in the file and in a page-aligned read buffer).
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fastpersist/status.h"

namespace fastpersist {

inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;
inline constexpr uint32_t kSafetensorsDefaultAlignment = 4096;

// Bytes per element of a safetensors dtype name ("F32" -> 4, "BOOL" -> 1, "F8_E4M3" -> 1,
// "C64" -> 8), nullopt when the name is not a whole-byte dtype the format defines (the sub-byte
// F4/F6 types are not supported).
std::optional<size_t> safetensors_dtype_size(std::string_view dtype);

struct SafetensorsTensor {
  std::string name;
  std::string dtype;            // safetensors name: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL ...
  std::vector<uint64_t> shape;  // empty for a scalar
  uint64_t begin = 0;           // data_offsets, relative to the data section
  uint64_t end = 0;
  uint64_t nbytes() const { return end - begin; }
};

struct SafetensorsHeader {
  std::vector<SafetensorsTensor> tensors;  // in data order (sorted by begin)
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // absolute file offset of the data section (8 + N)
  uint64_t data_bytes = 0;  // length of the data section
  uint64_t file_bytes() const { return data_start + data_bytes; }
  // Index into `tensors` by name, or nullopt.
  std::optional<size_t> find(std::string_view name) const;
};

// What a writer knows about a tensor before laying out the file.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
};

// Lays `entries` out in the given order (each begins where the previous ended) and encodes the
// header: the returned bytes are the 8-byte length plus the JSON, padded with spaces so their
// size is a multiple of `alignment` (a power of two >= 8). `layout` (may be null) receives the
// header as a reader will parse it, its `tensors` in the order of `entries` (a parse lists
// zero-sized tensors that share an offset by name instead; look tensors up by name).
// Errors (kInvalidArgument): empty or duplicate name, a name starting "__" (reserved by the
// format), unknown dtype, a name or metadata that is not UTF-8, a size over 64 bits, a header
// over the limit, a bad alignment.
Result<std::string> encode_safetensors_header(const std::vector<SafetensorsEntry>& entries,
                                              const std::map<std::string, std::string>& metadata,
                                              uint32_t alignment, SafetensorsHeader* layout);

// The order in which a writer lays `entries` out: widest element first, then as given, so that
// every tensor starts at a multiple of its element size in an aligned data section (indices
// into `entries`; an unknown dtype counts as 1 byte wide, and is refused by the encoder). The
// one rule: a checkpoint's data files (shard_plan) and save_safetensors both follow it.
std::vector<size_t> widest_first_order(const std::vector<SafetensorsEntry>& entries);

// Pads a header made by encode_safetensors_header with spaces to exactly `bytes` bytes (length
// prefix included), updating the prefix: how a writer that lays the data out first fills the
// room it reserved for the header. kInvalidArgument when the header is longer than that.
Result<std::string> pad_safetensors_header(std::string header, uint64_t bytes);

// Parses and validates a header. `prefix` holds at least the first 8 bytes of the file; when it
// is shorter than 8 + N the result is kOutOfRange with the size needed in the message's
// `length` (call again with more bytes). `file_bytes` is the file's size, checked exactly.
// A header that breaks a rule is kDataLoss (the file is damaged or not safetensors); the message
// names the problem and the Status carries `path` (used only for messages).
Result<SafetensorsHeader> parse_safetensors_header(std::string_view prefix, uint64_t file_bytes,
                                                   const std::string& path);

// Reads and validates the header of the file at `path` (two small buffered reads). Errors: those
// of parse_safetensors_header, and the OS's (kNotFound, kIoError) with errno and path.
Result<SafetensorsHeader> read_safetensors_header(const std::string& path);

}  // namespace fastpersist
