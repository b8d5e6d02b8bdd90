// SPDX-License-Identifier: Apache-2.0
// Which data file each tensor goes to, in which order, and the safetensors header of each file.
//
// Files: enough that each holds about target_file_bytes at most, and, for a state large enough,
// at least max_parallel_files (each holding min_file_bytes or more) so that they can be written
// at the same time. Tensors are dealt out largest first to the least-filled file (balanced);
// inside a file they are ordered by element size, widest first, so that every tensor starts at a
// multiple of its element size (the data section starts on a 4096 boundary).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fastpersist/layout.h"
#include "fastpersist/safetensors.h"
#include "fastpersist/shard_writer.h"
#include "fastpersist/status.h"

namespace fastpersist::checkpoint {

struct PlannedFile {
  std::string name;             // data_file_name(): tensors-00000-of-00002.safetensors
  std::vector<size_t> tensors;  // indices into the content's tensors, in file order
  std::string header;           // encoded safetensors header (length prefix + padded JSON)
  SafetensorsHeader layout;     // offsets of the tensors, same order as `tensors`
  uint64_t size = 0;            // whole file (encoded: the most it can take)
  // With compression the file is encoded (encoded_file_writer.h): the tensors' stored bytes
  // follow each other from `encoded_header_bytes` on, and the header, written last, is padded
  // to exactly that many bytes (reserved at plan time: the most the real header can take).
  // `header` and `layout` then describe the tensors as if raw (what the plan is checked by).
  bool encoded = false;
  uint64_t encoded_header_bytes = 0;
};

// The reserved header size of an encoded file whose raw header is `raw_layout`: every entry of
// the real header (U8 and one dimension for a compressed tensor, its own dtype and shape for a
// raw one, offsets of up to 20 digits) is at most 64 bytes longer than in the raw header.
uint64_t encoded_header_reserve(const SafetensorsHeader& raw_layout);

// Validates the tensors (names, dtypes, nbytes == shape x dtype size, data pointers) and plans
// the files, named by data_file_name(index, count, rank); with options.compression, encoded
// files. kInvalidArgument names the offending tensor.
// A file holding a tensor with a delta base (`deltas`: empty, or one entry per tensor) is
// encoded even without compression.
Result<std::vector<PlannedFile>> plan_files(
    const std::vector<TensorSource>& tensors, const DataFileOptions& options,
    std::optional<uint32_t> rank = std::nullopt,
    const std::vector<std::optional<DeltaSource>>& deltas = {});

}  // namespace fastpersist::checkpoint
