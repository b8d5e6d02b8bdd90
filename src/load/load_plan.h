// SPDX-License-Identifier: Apache-2.0
// The plan of a checkpoint load (private to src/load and the layers above): which stored tensors
// are read, where each one's elements go, and by which route. Planning checks everything a load can
// check before its first read (names, shapes, dtypes, every destination's capacity, strides and
// writability, encodings), in time linear in the number of tensors and destinations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fastpersist/checkpoint_load.h"
#include "fastpersist/manifest.h"
#include "fastpersist/pinned_buffer.h"
#include "fastpersist/status.h"

namespace fastpersist::checkpoint {

// Memory that receives a tensor's elements, already checked against its extent.
struct OutputMemory {
  std::byte* data = nullptr;
  std::string dtype;
  std::vector<uint64_t> shape;
  std::vector<int64_t> strides;  // in elements; empty: contiguous
};

enum class LoadRoute {
  kDirect,   // read straight into the one contiguous destination of the stored dtype
  kSpan,     // read into new aligned memory that becomes the result without a copy
  kConvert,  // read into a span, then converted / copied into the outputs
  kStream,   // larger than the memory budget: read in pieces, each written into the outputs
  kDecode,   // compressed: stored bytes read into a span, decoded on every core into the
             // destination, new memory, or a span that is then converted into the outputs
};

struct PlannedTensor {
  size_t tensor = 0;  // manifest index
  std::string dtype;  // of the loaded elements
  LoadRoute route = LoadRoute::kSpan;
  std::vector<size_t> destinations;  // indices of LoadRequest::destinations it fills
};

struct LoadPlan {
  std::vector<PlannedTensor> tensors;  // manifest order
  std::vector<DestinationState> destination_state;
  std::vector<std::string> missing, unexpected, mismatched;
  uint64_t total_bytes = 0;  // stored bytes of every planned tensor
};

Result<LoadPlan> plan_load(const Manifest& manifest, const std::string& dir,
                           const LoadRequest& request);

// Bytes a destination of `shape` and `strides` (elements of `element_size`) spans from its
// first element; kInvalidArgument for negative or overlapping strides.
Result<uint64_t> destination_extent(const std::vector<uint64_t>& shape,
                                    const std::vector<int64_t>& strides, size_t element_size);

// Whether `strides` (in elements; empty counts as contiguous) lay `shape` out row-major without
// gaps (dimensions of size 1 may have any stride).
bool is_contiguous(const std::vector<uint64_t>& shape, const std::vector<int64_t>& strides);

// kInvalidArgument naming the first range that is not writable memory of this process.
struct MemoryRange {
  const std::byte* data = nullptr;
  uint64_t size = 0;
  const std::string* name = nullptr;
};
Status check_writable(std::vector<MemoryRange> ranges);

// New memory for loaded tensors: aligned, not locked. `huge_pages`: advise transparent huge
// pages before the first touch, for memory that CPU threads fill (decoded tensors): their page
// faults otherwise cost 40% of a decoding thread's time on the benchmark VM
// (docs/compression.md); memory that O_DIRECT fills keeps ordinary pages (docs/performance.md).
Result<std::shared_ptr<PinnedBuffer>> new_load_memory(uint64_t bytes, bool huge_pages = false);
// Faults `buffers` in on every core (prefault_memory) before anything reads into them: new
// memory that the staged ring then fills.
void prefault_load_memory(const std::vector<std::shared_ptr<PinnedBuffer>>& buffers);

// A destination as the memory write_elements fills (contiguous strides spelled as empty).
OutputMemory output_of(const LoadDestination& d);

// Writes `count` elements of `src` (dtype `src_dtype`, contiguous), which are elements
// [first, first + count) of the tensor in row-major order, into `out`, converting.
Status write_elements(const std::byte* src, const std::string& src_dtype, uint64_t first,
                      uint64_t count, const OutputMemory& out);

}  // namespace fastpersist::checkpoint
