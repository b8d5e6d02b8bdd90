// SPDX-License-Identifier: Apache-2.0
// A whole checkpoint load, planned and run in C++ (CheckpointReader::load): which tensors, where
// each one goes, which dtype it ends in, how much memory may be in flight, progress, checksums
// and the strict checks. The Python façade only builds a LoadRequest and wraps the result.
//
// Every destination carries its capacity, dtype, shape and strides; load() checks all of them,
// and that the memory is writable, before the first read, so no checkpoint and no caller mistake
// can make it write outside the memory it was given.
//
// Thread-safety: plain values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fastpersist/memory_kind.h"
#include "fastpersist/pinned_buffer.h"

namespace fastpersist {

// Caller memory a tensor is loaded into. `data` == nullptr declares a destination the caller
// fills itself (memory the load cannot write, e.g. a GPU's): the strict checks still apply and
// the tensor is returned in new host memory in `dtype`.
struct LoadDestination {
  std::string name;             // the tensor's name in the checkpoint (or an alias)
  std::byte* data = nullptr;    // the first element
  uint64_t capacity_bytes = 0;  // bytes writable from `data` on (the view's extent)
  std::string dtype;            // safetensors name of the destination's elements
  std::vector<uint64_t> shape;
  // In elements, one per dimension; empty: contiguous. No negative or overlapping strides.
  std::vector<int64_t> strides;
  // Memory of CUDA device `device` (kCudaDevice): filled from the pinned slots of the staged
  // read with host-to-device copies on a stream of fastpersist's own, on a thread of its own,
  // and complete when load() returns. Only a tensor stored raw, in this dtype, contiguous, with
  // this as its one destination goes there; otherwise the destination is treated as
  // caller-copies (data == nullptr). The caller must not use the memory until load() returned.
  MemoryKind memory = MemoryKind::kHost;
  int device = -1;
};

struct LoadRequest {
  // Names to load (stored names or aliases), in any order; nullopt: every tensor. Each name
  // that the checkpoint does not have is "missing".
  std::optional<std::vector<std::string>> names;
  // Where named tensors go. With `into` set, a selected tensor without a destination is
  // "unexpected", and (when `names` is nullopt) a destination whose name the checkpoint does
  // not have is "missing".
  std::vector<LoadDestination> destinations;
  bool into = false;
  // A blanket dtype for the floating-point tensors loaded into new memory ("" keeps the stored
  // one), and per-name dtypes (aliases resolve to their stored tensor; two names of one tensor
  // asking for different dtypes is an error).
  std::string dtype;
  std::map<std::string, std::string> dtype_by_name;
  // strict: missing, unexpected and shape-mismatched names, and dtype_by_name names the
  // checkpoint does not have, are an error listing all of them. Non-strict: they are skipped;
  // a destination of the wrong shape is not written and its tensor is loaded into new memory.
  bool strict = true;
  // A destination whose dtype its tensor cannot be converted to (conversion_supported) is left
  // to the caller (kCallerCopies, the tensor in new memory in its stored dtype) instead of
  // failing the load: for callers that convert what the load cannot (DCP's reader copies with
  // torch).
  bool unconvertible_to_caller = false;
  bool verify = true;       // check every tensor's checksum (kDataLoss names file and tensor)
  uint64_t max_memory = 0;  // bytes of file data in flight (0: unbounded)
  // (tensor bytes loaded, tensor bytes to load), before the first read and after each batch.
  std::function<void(uint64_t, uint64_t)> progress;
};

// One stored tensor the load produced.
struct LoadedTensor {
  size_t tensor = 0;  // index into the manifest's tensors
  std::string dtype;  // of the loaded elements
  std::vector<uint64_t> shape;
  // In new memory: `buffer` holds the elements at `offset` (a multiple of the element size,
  // so a tensor viewing them is aligned and starts its storage at its first byte).
  std::shared_ptr<PinnedBuffer> buffer;
  size_t offset = 0;
  uint64_t nbytes = 0;
  // Or in the caller's memory: the index of a destination that holds it (every destination
  // of the tensor is then filled, see LoadResult::destinations); -1 when in new memory.
  long destination = -1;
};

// What became of each destination.
enum class DestinationState : uint8_t {
  kUnused,  // not selected, not in the checkpoint, or (non-strict) of another shape
  kFilled,  // holds its tensor, converted to its dtype
  // Declared with data == nullptr: the tensor is in new memory in its dtype. Or, with
  // unconvertible_to_caller, a dtype it cannot convert to: in new memory in its stored dtype.
  kCallerCopies,
};

struct LoadResult {
  std::vector<LoadedTensor> tensors;           // one per stored tensor loaded, in manifest order
  std::vector<long> loaded_index;              // per manifest tensor: index into `tensors` or -1
  std::vector<DestinationState> destinations;  // per LoadRequest::destinations entry
  // What the strict checks found (empty under strict, which fails instead).
  std::vector<std::string> missing;
  std::vector<std::string> unexpected;
  std::vector<std::string> mismatched;
  uint64_t bytes_read = 0;
};

}  // namespace fastpersist
