// SPDX-License-Identifier: Apache-2.0
// TensorSource: one tensor handed to a writer (ShardWriter, CheckpointManager), described in
// safetensors terms. It only points at the caller's memory; the caller keeps that memory alive
// and unchanged until the writer says the snapshot is done.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fastpersist {

// One tensor to save: its bytes in C order.
struct TensorSource {
  std::string name;
  std::string dtype;  // safetensors dtype name
  std::vector<uint64_t> shape;
  const std::byte* data = nullptr;
  uint64_t nbytes = 0;  // must equal product(shape) * dtype size
  // -1: `data` is host memory. N >= 0: `data` is memory of CUDA device N; the snapshot copies it
  // into pinned staging with the CUDA runtime (loaded at run time). The caller makes sure the
  // device has finished writing it (e.g. synchronizes the stream that produced it).
  int device = -1;
};

}  // namespace fastpersist
