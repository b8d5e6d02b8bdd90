// SPDX-License-Identifier: Apache-2.0
// Transfers between CUDA device memory and a file through pinned host memory, for AioHandle
// (DeepNVMe's aio_handle accepts device tensors the same way). The kernel cannot read or write
// device memory, so the bytes go chunk by chunk through a ring of pinned slots:
//
//   write: device --(async copy, our own stream)--> slot k --(engine write)--> file,
//          while the engine writes slots k-1, k-2, ... the next chunk is copied;
//   read:  file --(engine reads into every free slot)--> slot k --(async copy)--> device,
//          while the copy of slot k runs the other slots are being read.
//
// Each chunk but the first starts at a file offset that is a multiple of 4096, and the first
// lies in its slot at the offset's remainder, so every chunk's aligned body goes O_DIRECT
// without a bounce copy, whatever the transfer's offset and length.
//
// Runs on the calling thread, which it makes current on the buffer's device (cudaSetDevice):
// call it from a thread of our own, never from the caller's (its current device is torch's).
// Copies run on that thread's non-blocking stream (buffer/device_copy.h): they do not wait for
// work queued on other streams, so the caller must have finished writing the device memory
// (the Python façade synchronizes the tensor's current stream first) and must not touch it
// until the transfer returned.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fastpersist/io_engine.h"
#include "fastpersist/memory_kind.h"
#include "fastpersist/pinned_buffer.h"
#include "fastpersist/status.h"

namespace fastpersist::handle {

struct StagedTransfer {
  IoKind kind = IoKind::kWrite;
  MemorySpan memory;  // kCudaDevice memory
  std::string path;   // by name, or ...
  int fd = -1;        // ... the caller's descriptor
  uint64_t file_offset = 0;
  bool truncate = false;
};

// Slot size and count for an engine: a slot carries about one request's worth for every
// worker (block_size * intra_op_parallelism, 4 to 64 MiB), and kStagingSlots slots keep copies
// and I/O overlapped.
inline constexpr unsigned kStagingSlots = 4;
size_t staging_chunk_bytes(const EngineOptions& options);

// One chunk of a staged transfer: where its bytes lie in the file, in the device buffer, and in
// its slot (the first chunk's file offset modulo 4096, so the slot's page-aligned start lines
// up with the file for O_DIRECT; 0 for the others, which start on a multiple of 4096). Pure
// arithmetic, tested on its own: the chunks cover the range once, in order, and
// slot_offset + length never exceeds `chunk`.
struct StagingChunk {
  uint64_t file_offset = 0;
  uint64_t length = 0;
  uint64_t memory_offset = 0;
  uint64_t slot_offset = 0;
};
std::vector<StagingChunk> plan_staging_chunks(uint64_t file_offset, uint64_t length,
                                              uint64_t chunk);

// Moves the bytes; the first error (a copy, an open, a read past the end of the file, an I/O
// error) after every chunk in flight finished. A read past the end of the file is refused before
// any byte is copied into device memory.
Status run_staged_transfer(IoEngine& engine, PinnedBufferPool& pool, const StagedTransfer& t);

}  // namespace fastpersist::handle
