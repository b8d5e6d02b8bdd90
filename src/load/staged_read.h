// SPDX-License-Identifier: Apache-2.0
// Reading tensors into caller memory that O_DIRECT cannot use directly (private to src/load
// and the layers above).
//
// A load `into=` existing tensors targets memory the caller allocated: torch's CPU tensors sit
// 64 bytes into a page, and a tensor's bytes start anywhere in its data file, so neither the
// address nor the file offset meets O_DIRECT's alignment. Reading each tensor through the
// engine's per-request bounce buffers costs a copy on the I/O worker and a buffered read of each
// tensor's unaligned head and tail, and measured about 0.75x of fio's read (docs/performance.md).
// Instead the tensors' byte ranges are cut, in file order, into pieces that fill a small ring of
// page-aligned slots; each piece is one aligned O_DIRECT read, and while the engine reads the
// next pieces the calling thread copies the finished one into the destinations (and hashes the
// bytes it just copied, while they are in cache). The slots come from the process's pinned
// pool (default_pinned_pool): warm after the first load, so the O_DIRECT reads never land in
// memory being faulted in (a fresh ring per call put a load into= at 0.65 to 1.04 GB/s on the
// benchmark VM, the pooled one at 1.8 to 2.7). New memory for loaded tensors is filled the same
// way (CheckpointReader::read).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fastpersist/io_engine.h"
#include "fastpersist/status.h"

namespace fastpersist::checkpoint {

struct StagedTarget {
  std::string path;  // the data file
  uint64_t file_size = 0;
  uint64_t file_offset = 0;  // the tensor's bytes in it
  uint64_t length = 0;
  std::byte* destination = nullptr;
  int device = -1;  // >= 0: `destination` is memory of this CUDA device (copied, not memcpy'd)
};

struct StagedReadOptions {
  uint64_t slot_bytes = uint64_t{32} << 20;  // multiple of 4096
  size_t slots = 8;
  uint64_t max_gap_bytes = uint64_t{1} << 20;  // unrequested bytes read to join two ranges
  // Called with each target's index and the XXH3-64 of its bytes once all of them arrived;
  // a non-OK status stops the read and is returned. Null: no checksums computed.
  std::function<Status(size_t target, uint64_t checksum)> on_checksum;
};

// Reads every target (sorted here by path and offset; ranges must not overlap). Returns the
// first error; on error some destinations may hold partial data. Device targets get
// host-to-device copies from the (pinned) slot on this thread's stream, waited for before the
// slot is read into again; the checksum is taken from the slot. With device targets, call it
// on a thread of its own: it selects their devices on the calling thread.
Status read_staged(IoEngine& engine, const std::vector<StagedTarget>& targets,
                   const StagedReadOptions& options);

}  // namespace fastpersist::checkpoint
