// SPDX-License-Identifier: Apache-2.0
#include "io/transfer_plan.h"

#include <algorithm>

#include "common/align.h"

namespace fastpersist::io {

std::vector<Slice> split_into_slices(uint64_t file_offset, uint64_t length, unsigned parts,
                                     uint64_t alignment) {
  std::vector<Slice> slices;
  if (length == 0) return slices;
  parts = std::max(parts, 1u);
  const uint64_t end = file_offset + length;
  uint64_t start = file_offset;
  for (unsigned i = 1; i <= parts; ++i) {
    uint64_t cut = end;
    if (i < parts) {
      // Ideal cut at i/parts of the range (computed without overflow), snapped down to alignment.
      uint64_t ideal = file_offset + (length / parts) * i + (length % parts) * i / parts;
      cut = std::clamp(align_down(ideal, alignment), start, end);
    }
    if (cut > start) {
      slices.push_back({start, cut - start, start - file_offset});
      start = cut;
    }
  }
  return slices;
}

std::vector<Segment> plan_segments(const Slice& s, const SegmentRules& rules) {
  std::vector<Segment> out;
  if (s.length == 0) return out;
  const uint64_t end = s.file_offset + s.length;
  const uint64_t body_start = align_up(s.file_offset, rules.split_alignment);
  const uint64_t body_end = align_down(end, rules.split_alignment);
  if (!rules.direct || s.length < rules.min_direct_bytes || body_start >= body_end) {
    out.push_back({SegmentKind::kBuffered, s.file_offset, s.length, s.buffer_offset});
    return out;
  }
  auto buffer_offset_of = [&](uint64_t file_off) {
    return s.buffer_offset + (file_off - s.file_offset);
  };
  if (body_start > s.file_offset) {
    out.push_back(
        {SegmentKind::kBuffered, s.file_offset, body_start - s.file_offset, s.buffer_offset});
  }
  uint64_t body_address = rules.buffer_address + buffer_offset_of(body_start);
  SegmentKind body_kind = is_aligned(body_address, rules.memory_alignment)
                              ? SegmentKind::kDirect
                              : SegmentKind::kDirectBounce;
  out.push_back({body_kind, body_start, body_end - body_start, buffer_offset_of(body_start)});
  if (end > body_end) {
    out.push_back({SegmentKind::kBuffered, body_end, end - body_end, buffer_offset_of(body_end)});
  }
  return out;
}

}  // namespace fastpersist::io
