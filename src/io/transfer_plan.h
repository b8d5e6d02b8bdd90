// SPDX-License-Identifier: Apache-2.0
// Pure arithmetic of a transfer: how a request is cut into per-worker slices, and how a slice is
// cut into buffered and O_DIRECT segments. No I/O here, so it is tested exhaustively.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fastpersist::io {

struct Slice {
  uint64_t file_offset = 0;
  uint64_t length = 0;
  uint64_t buffer_offset = 0;  // from the start of the request's buffer
};

// Cuts [file_offset, file_offset + length) into `parts` contiguous slices of nearly equal size
// whose inner boundaries are multiples of `alignment` in file space, so every worker's slice is
// block-aligned. Empty slices are dropped; the slices cover the range exactly once.
std::vector<Slice> split_into_slices(uint64_t file_offset, uint64_t length, unsigned parts,
                                     uint64_t alignment);

enum class SegmentKind { kBuffered, kDirect, kDirectBounce };

struct Segment {
  SegmentKind kind = SegmentKind::kBuffered;
  uint64_t file_offset = 0;
  uint64_t length = 0;
  uint64_t buffer_offset = 0;  // from the start of the request's buffer
};

struct SegmentRules {
  bool direct = false;            // the file has an O_DIRECT descriptor
  uint64_t min_direct_bytes = 0;  // smaller slices go buffered
  uint64_t split_alignment = 4096;
  uint64_t memory_alignment = 512;
  uintptr_t buffer_address = 0;  // address of the request's buffer (for the memory check)
};

// Head (unaligned, buffered), body (aligned, direct; bounced when the memory is misaligned), tail
// (unaligned, buffered). Segments are in file order and cover the slice exactly once.
std::vector<Segment> plan_segments(const Slice& slice, const SegmentRules& rules);

}  // namespace fastpersist::io
