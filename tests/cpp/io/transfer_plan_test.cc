// SPDX-License-Identifier: Apache-2.0
// Property tests of the transfer arithmetic: every byte of a request is covered exactly once, in
// order, by slices whose inner boundaries are aligned, and by segments whose O_DIRECT part is
// aligned and bounced exactly when the memory is misaligned. Checked exhaustively over small
// ranges and on many random large ones.
#include "io/transfer_plan.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/align.h"

namespace fastpersist::io {
namespace {

std::string describe(uint64_t offset, uint64_t length, unsigned parts, uint64_t alignment) {
  std::ostringstream s;
  s << "offset " << offset << ", length " << length << ", parts " << parts << ", alignment "
    << alignment;
  return s.str();
}

// Checks every property of split_into_slices; returns "" or what is wrong.
std::string check_split(uint64_t offset, uint64_t length, unsigned parts, uint64_t alignment) {
  std::vector<Slice> slices = split_into_slices(offset, length, parts, alignment);
  std::ostringstream err;
  if (length == 0) {
    if (!slices.empty()) err << "an empty request has " << slices.size() << " slices";
    return err.str();
  }
  if (slices.empty()) return "a non-empty request has no slices";
  if (slices.size() > std::max(parts, 1u))
    err << slices.size() << " slices for " << parts << " parts; ";
  uint64_t pos = offset;
  for (size_t i = 0; i < slices.size(); ++i) {
    const Slice& s = slices[i];
    if (s.file_offset != pos)
      err << "slice " << i << " starts at " << s.file_offset << ", expected " << pos << "; ";
    if (s.length == 0) err << "slice " << i << " is empty; ";
    if (s.buffer_offset != s.file_offset - offset)
      err << "slice " << i << " buffer offset " << s.buffer_offset << "; ";
    if (i > 0 && !is_aligned(s.file_offset, alignment)) {
      err << "inner boundary " << s.file_offset << " not aligned; ";
    }
    // Cuts are snapped down from the ideal equal split, so no slice exceeds its share by more
    // than one alignment unit.
    uint64_t share = length / std::max(parts, 1u) + 1;
    if (s.length > share + alignment)
      err << "slice " << i << " of " << s.length << " bytes exceeds the share " << share << "; ";
    pos = s.file_offset + s.length;
  }
  if (pos != offset + length)
    err << "slices end at " << pos << ", expected " << offset + length << "; ";
  // When each share holds at least one alignment unit, every worker gets a slice.
  if (parts > 0 && length / parts >= alignment && slices.size() != parts) {
    err << "only " << slices.size() << " slices although every share is at least one unit; ";
  }
  return err.str();
}

// Checks every property of plan_segments; returns "" or what is wrong.
std::string check_segments(const Slice& slice, const SegmentRules& rules) {
  std::vector<Segment> segs = plan_segments(slice, rules);
  std::ostringstream err;
  if (slice.length == 0) {
    if (!segs.empty()) err << "an empty slice has segments";
    return err.str();
  }
  const uint64_t end = slice.file_offset + slice.length;
  const uint64_t a = rules.split_alignment;
  const uint64_t body_start = align_up(slice.file_offset, a);
  const uint64_t body_end = align_down(end, a);
  const bool any_body = body_start < body_end;
  const bool want_direct = rules.direct && slice.length >= rules.min_direct_bytes && any_body;

  uint64_t pos = slice.file_offset;
  int direct_segments = 0;
  for (size_t i = 0; i < segs.size(); ++i) {
    const Segment& s = segs[i];
    if (s.file_offset != pos)
      err << "segment " << i << " starts at " << s.file_offset << ", expected " << pos << "; ";
    if (s.length == 0) err << "segment " << i << " is empty; ";
    if (s.buffer_offset - slice.buffer_offset != s.file_offset - slice.file_offset) {
      err << "segment " << i << " buffer offset " << s.buffer_offset
          << " does not follow the file offset; ";
    }
    pos = s.file_offset + s.length;
    if (s.kind == SegmentKind::kBuffered) continue;
    ++direct_segments;
    if (!want_direct)
      err << "segment " << i << " is direct although the slice should be buffered; ";
    if (s.file_offset != body_start || s.file_offset + s.length != body_end) {
      err << "direct segment [" << s.file_offset << ", " << s.file_offset + s.length
          << ") is not the aligned body [" << body_start << ", " << body_end << "); ";
    }
    bool memory_aligned =
        is_aligned(rules.buffer_address + s.buffer_offset, rules.memory_alignment);
    SegmentKind expected = memory_aligned ? SegmentKind::kDirect : SegmentKind::kDirectBounce;
    if (s.kind != expected)
      err << "direct segment " << i << " bounce=" << (s.kind == SegmentKind::kDirectBounce)
          << " with memory aligned=" << memory_aligned << "; ";
  }
  if (pos != end) err << "segments end at " << pos << ", expected " << end << "; ";
  if (want_direct) {
    if (direct_segments != 1) err << direct_segments << " direct segments, expected 1; ";
    size_t expected_count = 1 + (body_start > slice.file_offset) + (end > body_end);
    if (segs.size() != expected_count)
      err << segs.size() << " segments, expected " << expected_count << "; ";
  } else if (segs.size() != 1) {
    err << segs.size() << " segments for a buffered slice, expected 1; ";
  }
  return err.str();
}

TEST(SplitIntoSlicesTest, EmptyRequestHasNoSlices) {
  EXPECT_TRUE(split_into_slices(0, 0, 4, 4096).empty());
  EXPECT_TRUE(split_into_slices(12345, 0, 1, 512).empty());
}

TEST(SplitIntoSlicesTest, OnePartIsTheWholeRange) {
  auto s = split_into_slices(4097, 1000003, 1, 4096);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].file_offset, 4097u);
  EXPECT_EQ(s[0].length, 1000003u);
  EXPECT_EQ(s[0].buffer_offset, 0u);
}

TEST(SplitIntoSlicesTest, ZeroPartsMeansOne) {
  auto s = split_into_slices(0, 10, 0, 4096);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].length, 10u);
}

TEST(SplitIntoSlicesTest, LengthNotDivisibleByParallelism) {
  // 3 MiB + 7 over 3 workers: cuts at 1 MiB and 2 MiB, the remainder goes to the last one.
  auto s = split_into_slices(0, (3 << 20) + 7, 3, 4096);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].length, uint64_t{1} << 20);
  EXPECT_EQ(s[1].file_offset, uint64_t{1} << 20);
  EXPECT_EQ(s[2].file_offset, uint64_t{2} << 20);
  EXPECT_EQ(s[2].length, (uint64_t{1} << 20) + 7);
}

TEST(SplitIntoSlicesTest, SmallRequestStaysOneSlice) {
  // Shorter than one alignment unit: no aligned cut exists, one worker does it all.
  auto s = split_into_slices(100, 511, 8, 4096);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].length, 511u);
}

TEST(SplitIntoSlicesTest, ExhaustiveSmallRanges) {
  int checked = 0;
  for (uint64_t alignment : {1, 2, 8, 16}) {
    for (uint64_t offset = 0; offset <= 3 * alignment + 3; ++offset) {
      for (uint64_t length = 0; length <= 9 * alignment + 5; ++length) {
        for (unsigned parts = 0; parts <= 6; ++parts) {
          std::string err = check_split(offset, length, parts, alignment);
          ASSERT_EQ(err, "") << describe(offset, length, parts, alignment);
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 10000);
}

TEST(SplitIntoSlicesTest, RandomLargeRanges) {
  std::mt19937_64 rng(20240501);
  const uint64_t alignments[] = {512, 4096, 65536, 1 << 20};
  for (int i = 0; i < 50000; ++i) {
    uint64_t alignment = alignments[rng() % 4];
    // Mix small, block-sized and huge values, plus values just around alignment boundaries.
    uint64_t offset = 0, length = 0;
    switch (rng() % 4) {
      case 0:
        offset = rng() % (1 << 16);
        length = rng() % (1 << 24);
        break;
      case 1: {  // within one byte of an alignment boundary
        offset = (rng() % 64) * alignment + (rng() % 3);
        if (offset > 0) offset -= 1;
        length = (rng() % 64) * alignment + (rng() % 3);
        break;
      }
      case 2:
        offset = rng() % (uint64_t{1} << 50);
        length = rng() % (uint64_t{1} << 40);
        break;
      default:
        offset = rng() % (uint64_t{1} << 62);
        length = rng() % (uint64_t{1} << 62);
        break;
    }
    if (offset > uint64_t{INT64_MAX}) offset = 0;
    unsigned parts = 1 + static_cast<unsigned>(rng() % 64);
    std::string err = check_split(offset, length, parts, alignment);
    ASSERT_EQ(err, "") << describe(offset, length, parts, alignment);
  }
}

TEST(PlanSegmentsTest, AlignedSliceIsOneDirectSegment) {
  SegmentRules rules{true, 0, 4096, 512, 0x10000};
  auto segs = plan_segments({8192, 1 << 20, 0}, rules);
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0].kind, SegmentKind::kDirect);
  EXPECT_EQ(segs[0].file_offset, 8192u);
  EXPECT_EQ(segs[0].length, uint64_t{1} << 20);
}

TEST(PlanSegmentsTest, UnalignedHeadAndTailAreBuffered) {
  SegmentRules rules{true, 0, 4096, 512, 0x10000};
  // [4097, 4097 + 1 MiB + 7): head to 8192, body to the last 4 KiB boundary, tail after it.
  Slice slice{4097, (1 << 20) + 7, 0};
  auto segs = plan_segments(slice, rules);
  ASSERT_EQ(segs.size(), 3u);
  EXPECT_EQ(segs[0].kind, SegmentKind::kBuffered);
  EXPECT_EQ(segs[0].file_offset, 4097u);
  EXPECT_EQ(segs[0].length, 8192u - 4097u);
  EXPECT_EQ(segs[1].file_offset, 8192u);
  EXPECT_EQ(segs[1].buffer_offset, 8192u - 4097u);
  EXPECT_EQ(segs[2].kind, SegmentKind::kBuffered);
  EXPECT_EQ(segs[2].file_offset + segs[2].length, 4097u + (1 << 20) + 7);
  // The body's memory address is 0x10000 + 4095: misaligned, so it goes through a bounce buffer.
  EXPECT_EQ(segs[1].kind, SegmentKind::kDirectBounce);
}

TEST(PlanSegmentsTest, MisalignedMemoryBounces) {
  SegmentRules rules{true, 0, 4096, 512, 0x10001};
  auto segs = plan_segments({0, 1 << 20, 0}, rules);
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0].kind, SegmentKind::kDirectBounce);
}

TEST(PlanSegmentsTest, BufferedWhenNotDirectTooSmallOrNoWholeBlock) {
  Slice slice{0, 1 << 20, 0};
  SegmentRules rules{false, 0, 4096, 512, 0x10000};
  auto segs = plan_segments(slice, rules);
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0].kind, SegmentKind::kBuffered);

  rules.direct = true;
  rules.min_direct_bytes = (1 << 20) + 1;
  segs = plan_segments(slice, rules);
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0].kind, SegmentKind::kBuffered);

  rules.min_direct_bytes = 0;
  segs = plan_segments({4097, 8000, 0}, rules);  // [4097, 12097) holds no whole 4 KiB block
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0].kind, SegmentKind::kBuffered);
}

TEST(PlanSegmentsTest, ExhaustiveSmallSlices) {
  int checked = 0;
  for (uint64_t a : {1, 4, 16}) {
    for (uint64_t mem_align : {1, 2, 8}) {
      for (uintptr_t address : {uintptr_t{0x1000}, uintptr_t{0x1001}, uintptr_t{0x1003}}) {
        for (uint64_t offset = 0; offset <= 3 * a + 2; ++offset) {
          for (uint64_t length = 0; length <= 6 * a + 3; ++length) {
            for (uint64_t buffer_offset : {uint64_t{0}, uint64_t{1}, a}) {
              for (bool direct : {false, true}) {
                for (uint64_t min_direct : {uint64_t{0}, 2 * a}) {
                  SegmentRules rules{direct, min_direct, a, mem_align, address};
                  Slice slice{offset, length, buffer_offset};
                  ASSERT_EQ(check_segments(slice, rules), "")
                      << "slice " << describe(offset, length, 1, a) << ", buffer offset "
                      << buffer_offset << ", address " << address << ", memory alignment "
                      << mem_align << ", direct " << direct << ", min " << min_direct;
                  ++checked;
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 10000);
}

TEST(PlanSegmentsTest, RandomRequestsSplitThenPlanned) {
  // The whole pipeline the engine runs: request -> slices -> segments, checked end to end.
  std::mt19937_64 rng(77);
  for (int i = 0; i < 20000; ++i) {
    uint64_t a = uint64_t{512} << (rng() % 5);  // 512 .. 8192
    uint64_t mem_align = uint64_t{1} << (rng() % 13);
    uint64_t offset = rng() % 2 ? (rng() % 32) * a : rng() % (uint64_t{1} << 30);
    uint64_t length = rng() % 2 ? (rng() % 64) * a + rng() % 3 : rng() % (uint64_t{64} << 20);
    unsigned parts = 1 + static_cast<unsigned>(rng() % 8);
    uintptr_t address = 0x7f0000000000 + (rng() % 4 == 0 ? rng() % 4096 : 0);
    SegmentRules rules{rng() % 4 != 0, rng() % 2 ? 0 : uint64_t{64} << 10, a, mem_align, address};
    uint64_t covered = offset;
    for (const Slice& slice : split_into_slices(offset, length, parts, a)) {
      ASSERT_EQ(check_segments(slice, rules), "") << describe(offset, length, parts, a);
      for (const Segment& s : plan_segments(slice, rules)) {
        ASSERT_EQ(s.file_offset, covered) << describe(offset, length, parts, a);
        ASSERT_EQ(s.buffer_offset, s.file_offset - offset);
        covered += s.length;
      }
    }
    ASSERT_EQ(covered, offset + length) << describe(offset, length, parts, a);
  }
}

}  // namespace
}  // namespace fastpersist::io
