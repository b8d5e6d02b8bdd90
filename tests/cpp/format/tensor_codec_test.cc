// SPDX-License-Identifier: Apache-2.0
// Compressed tensor encodings (tensor_codec.h): byte grouping, one frame per chunk with each
// codec, the chunk table, and decoders fed damaged or hostile bytes (errors, never a crash or a
// write past the chunk).
#include "fastpersist/tensor_codec.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "testing/status_matchers.h"
#include "testing/test_util.h"

namespace fastpersist::testing {
namespace {

// Floats of a narrow range: what weights look like (compressible exponent bytes).
std::vector<std::byte> smooth_f32(size_t count, uint64_t seed) {
  std::vector<std::byte> out(count * 4);
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (size_t i = 0; i < count; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    float v = static_cast<float>(static_cast<int64_t>(x % 2001) - 1000) * 1e-5f;
    std::memcpy(out.data() + 4 * i, &v, 4);
  }
  return out;
}

TEST(TensorCodecTest, ByteGroupingRoundTripsEveryWidth) {
  for (size_t width : {1, 2, 3, 4, 8, 16}) {
    std::vector<std::byte> raw = random_bytes(width * 10007, width);
    std::vector<std::byte> grouped(raw.size()), back(raw.size());
    group_bytes(raw.data(), raw.size(), width, grouped.data());
    if (width == 4) {
      // Element 1's first byte comes right after element 0's first byte.
      EXPECT_EQ(grouped[1], raw[4]);
      EXPECT_EQ(grouped[10007], raw[1]);
    }
    ungroup_bytes(grouped.data(), grouped.size(), width, back.data());
    EXPECT_EQ(back, raw) << "width " << width;
  }
}

TEST(TensorCodecTest, FramesRoundTripWithEachCodecAndLevel) {
  std::vector<std::byte> raw = smooth_f32(300000, 3);  // 1.2 MB
  ChunkCodec codec;
  for (Compression c : {Compression::kZstd, Compression::kLz4}) {
    for (int level : {default_compression_level(c), c == Compression::kZstd ? 3 : 9}) {
      FP_ASSERT_OK(check_compression_level(c, level));
      std::vector<std::byte> frame(chunk_frame_bound(c, raw.size()));
      FP_ASSERT_OK_AND_ASSIGN(
          size_t n, codec.encode(c, level, 4, raw.data(), raw.size(), frame.data(), frame.size()));
      // zstd's entropy coding finds the narrow exponents; lz4 (matches only) finds less.
      EXPECT_LT(n, c == Compression::kZstd ? raw.size() * 9 / 10 : raw.size())
          << compression_name(c) << " level " << level;
      std::vector<std::byte> back(raw.size());
      FP_ASSERT_OK(codec.decode(c, 4, frame.data(), n, back.data(), back.size()));
      EXPECT_EQ(back, raw);
      // Asked for another size, or fed a truncated or damaged frame: refused.
      EXPECT_EQ(codec.decode(c, 4, frame.data(), n, back.data(), back.size() - 4).code(),
                StatusCode::kDataLoss);
      EXPECT_EQ(codec.decode(c, 4, frame.data(), n - 1, back.data(), back.size()).code(),
                StatusCode::kDataLoss);
      std::vector<std::byte> bad(frame.begin(), frame.begin() + static_cast<long>(n));
      bad[n / 2] ^= std::byte{0x40};
      EXPECT_EQ(codec.decode(c, 4, bad.data(), n, back.data(), back.size()).code(),
                StatusCode::kDataLoss)
          << compression_name(c);
    }
  }
}

TEST(TensorCodecTest, IncompressibleBytesStillRoundTrip) {
  std::vector<std::byte> raw = random_bytes(1 << 20, 9);
  ChunkCodec codec;
  for (Compression c : {Compression::kZstd, Compression::kLz4}) {
    std::vector<std::byte> frame(chunk_frame_bound(c, raw.size()));
    FP_ASSERT_OK_AND_ASSIGN(
        size_t n, codec.encode(c, 0, 8, raw.data(), raw.size(), frame.data(), frame.size()));
    EXPECT_GE(n, raw.size());
    std::vector<std::byte> back(raw.size());
    FP_ASSERT_OK(codec.decode(c, 8, frame.data(), n, back.data(), back.size()));
    EXPECT_EQ(back, raw);
  }
}

TEST(TensorCodecTest, GarbageAndTheOtherCodecsFramesAreRefused) {
  ChunkCodec codec;
  std::vector<std::byte> out(65536);
  for (uint64_t seed = 0; seed < 200; ++seed) {
    std::vector<std::byte> junk = random_bytes(1 + seed * 37, seed);
    for (Compression c : {Compression::kZstd, Compression::kLz4}) {
      EXPECT_FALSE(codec.decode(c, 2, junk.data(), junk.size(), out.data(), out.size()).is_ok());
    }
  }
  std::vector<std::byte> raw = smooth_f32(4096, 1);
  std::vector<std::byte> frame(chunk_frame_bound(Compression::kZstd, raw.size()));
  FP_ASSERT_OK_AND_ASSIGN(size_t n, codec.encode(Compression::kZstd, 1, 4, raw.data(), raw.size(),
                                                 frame.data(), frame.size()));
  std::vector<std::byte> back(raw.size());
  EXPECT_EQ(codec.decode(Compression::kLz4, 4, frame.data(), n, back.data(), back.size()).code(),
            StatusCode::kDataLoss);
}

TEST(TensorCodecTest, ChunkTableRoundTripsAndEveryFieldIsChecked) {
  const uint64_t raw_length = 10 * 4096 + 8;  // 11 chunks of 4096, the last 8 bytes
  const uint32_t chunk = 4096;
  std::vector<uint32_t> frames(11, 100);
  std::string table = encode_chunk_table(Compression::kZstd, chunk, 4, frames);
  EXPECT_EQ(table.size(), chunk_table_bytes(11));
  const uint64_t stored = 1100 + table.size();
  std::string stored_bytes = std::string(1100, 'x') + table;
  auto* p = reinterpret_cast<const std::byte*>(stored_bytes.data());
  FP_ASSERT_OK_AND_ASSIGN(uint64_t size,
                          chunk_table_size(p + stored - kChunkTableTrailerBytes, stored));
  EXPECT_EQ(size, table.size());
  FP_ASSERT_OK_AND_ASSIGN(
      ChunkTable t, parse_chunk_table(p + stored - size, size, Compression::kZstd, 4, raw_length,
                                      stored, "tensor 'w'"));
  EXPECT_EQ(t.chunks(), 11u);
  EXPECT_EQ(t.frame_offsets[3], 300u);
  EXPECT_EQ(t.chunk_raw_bytes(10, raw_length), 8u);

  auto refused = [&](const std::string& bytes, Compression c, size_t width, uint64_t length,
                     const char* why) {
    auto* q = reinterpret_cast<const std::byte*>(bytes.data());
    auto r = parse_chunk_table(q + 1100, bytes.size() - 1100, c, width, length, bytes.size(),
                               "tensor 'w'");
    ASSERT_FALSE(r.is_ok()) << why;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << why;
    EXPECT_NE(r.status().message().find("tensor 'w'"), std::string::npos) << r.status().to_string();
  };
  refused(stored_bytes, Compression::kLz4, 4, raw_length, "another codec");
  refused(stored_bytes, Compression::kZstd, 2, raw_length, "another width");
  refused(stored_bytes, Compression::kZstd, 4, raw_length + 4096, "a chunk more");
  refused(stored_bytes, Compression::kZstd, 4, raw_length - 8, "a chunk less");
  auto patched = [&](size_t at, char value) {
    std::string b = stored_bytes;
    b[1100 + at] = value;
    return b;
  };
  refused(patched(0, 0), Compression::kZstd, 4, raw_length, "skippable magic");
  refused(patched(8, 99), Compression::kZstd, 4, raw_length, "frames that do not add up");
  refused(patched(8, 0), Compression::kZstd, 4, raw_length, "frames that do not add up");
  const size_t trailer = table.size() - kChunkTableTrailerBytes;
  refused(patched(trailer + 9, 7), Compression::kZstd, 4, raw_length, "version");
  refused(patched(trailer + 15, 0), Compression::kZstd, 4, raw_length, "trailer magic");
  std::string zero_frame =
      encode_chunk_table(Compression::kZstd, chunk, 4, std::vector<uint32_t>(11, 0));
  refused(std::string(1100, 'x') + zero_frame, Compression::kZstd, 4, raw_length, "an empty frame");
  // A trailer that claims more chunks than the bytes hold is refused before anything is read.
  std::string huge = patched(trailer + 7, '\x7f');
  auto* h = reinterpret_cast<const std::byte*>(huge.data());
  EXPECT_EQ(
      chunk_table_size(h + huge.size() - kChunkTableTrailerBytes, huge.size()).status().code(),
      StatusCode::kDataLoss);
}

TEST(TensorCodecTest, NamesAndLevels) {
  FP_ASSERT_OK_AND_ASSIGN(Compression z, parse_compression("zstd"));
  EXPECT_EQ(z, Compression::kZstd);
  FP_ASSERT_OK_AND_ASSIGN(Compression none, parse_compression("none"));
  EXPECT_EQ(none, Compression::kNone);
  Status bad = parse_compression("gzip").status();
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("none, zstd or lz4"), std::string::npos);
  EXPECT_EQ(encoding_of(Compression::kLz4), "lz4");
  EXPECT_EQ(encoding_of(Compression::kNone), "raw");
  EXPECT_EQ(compression_of_encoding("zstd"), Compression::kZstd);
  EXPECT_FALSE(compression_of_encoding("delta").has_value());
  EXPECT_EQ(check_compression_level(Compression::kZstd, 99).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(check_compression_level(Compression::kLz4, 13).code(), StatusCode::kInvalidArgument);
  FP_EXPECT_OK(check_compression_level(Compression::kZstd, -5));
  EXPECT_NE(codec_versions().find("zstd 1."), std::string::npos) << codec_versions();
}

}  // namespace
}  // namespace fastpersist::testing
