// SPDX-License-Identifier: Apache-2.0
#include "fastpersist/checksum.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "testing/test_util.h"

namespace fastpersist {
namespace {

// The xorshift buffer of LLVM's xxhash unit test, whose XXH3-64 values were produced by the
// reference implementation; the lengths reach every code path (0-16, 17-128, 129-240, long).
std::vector<uint8_t> xorshift_bytes(size_t n) {
  std::vector<uint8_t> out(n);
  uint64_t x = 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[i] = static_cast<uint8_t>(x);
  }
  return out;
}

TEST(ChecksumTest, KnownVectors) {
  EXPECT_EQ(xxh3_64("", 0), 0x2D06800538D394C2u);
  EXPECT_EQ(xxh3_64(nullptr, 0), 0x2D06800538D394C2u);
  EXPECT_EQ(xxh3_64("a", 1), 0xE6C632B61E964E1Fu);
  const std::vector<uint8_t> data = xorshift_bytes(2243);
  const std::vector<std::pair<size_t, uint64_t>> vectors = {
      {0, 0x2d06800538d394c2},    {1, 0xd0d496e05c553485},    {2, 0x84d625edb7055eac},
      {3, 0x6ea2d59aca5c3778},    {4, 0xbf65290914e80242},    {5, 0xc01fd099ad4fc8e4},
      {6, 0x9e3ea8187399caa5},    {7, 0x9da8b60540644f5a},    {8, 0xabc1413da6cd0209},
      {9, 0x8bc89400bfed51f6},    {16, 0x7e46916754d7c9b8},   {17, 0xed4be912ba5f836d},
      {32, 0xf59b59b58c304fd1},   {33, 0x9013fb74ca603e0c},   {64, 0xfa5271fcce0db1c3},
      {65, 0x79c42431727f1012},   {96, 0x591ee0ddf9c9ccd1},   {97, 0x8ffc6a3111fe19da},
      {128, 0x06a146ee9a2da378},  {129, 0xbc7138129bf065da},  {403, 0xcefeb3ffa532ad8c},
      {512, 0xcdfa6b6268e3650f},  {513, 0x4bb5d42742f9765f},  {2048, 0x330ce110cbb79eae},
      {2049, 0x3ba6afa0249fef9a}, {2240, 0xd61d4d2a94e926a8}, {2243, 0x0979f786a24edde7},
  };
  for (const auto& [length, expected] : vectors) {
    EXPECT_EQ(xxh3_64(data.data(), length), expected) << "length " << length;
  }
}

TEST(ChecksumTest, StreamingInPiecesEqualsOneShot) {
  const std::vector<std::byte> data = testing::random_bytes(300'000, 7);
  // Piece sizes that straddle XXH3's internal 64-byte stripes and 256-byte buffer.
  for (size_t piece : {size_t{1}, size_t{3}, size_t{63}, size_t{64}, size_t{255}, size_t{256},
                       size_t{1000}, size_t{65536}, data.size()}) {
    Xxh3Stream stream;
    for (size_t at = 0; at < data.size(); at += piece) {
      stream.update(data.data() + at, std::min(piece, data.size() - at));
    }
    EXPECT_EQ(stream.digest(), xxh3_64(data.data(), data.size())) << "piece " << piece;
  }
}

TEST(ChecksumTest, StreamDigestAtEveryLength) {
  const std::vector<uint8_t> data = xorshift_bytes(600);
  Xxh3Stream stream;
  for (size_t length = 0; length <= data.size(); ++length) {
    ASSERT_EQ(stream.digest(), xxh3_64(data.data(), length)) << "length " << length;
    if (length < data.size()) stream.update(&data[length], 1);
  }
}

TEST(ChecksumTest, Xxh3_128KnownValueAndHex) {
  // XXH3-128 of no bytes, as xxhsum -H2 prints it (high 64 bits first).
  const ContentDigest empty = xxh3_128("", 0);
  EXPECT_EQ(digest_to_hex(empty), "99aa06d3014798d86001c324468d497f");
  EXPECT_EQ(digest_from_hex(digest_to_hex(empty)), empty);
  EXPECT_EQ(digest_from_hex("99AA06D3014798D86001C324468D497F"), std::nullopt);  // one spelling
  EXPECT_EQ(digest_from_hex("99aa06d3014798d86001c324468d497"), std::nullopt);
  EXPECT_NE(xxh3_128("a", 1), xxh3_128("b", 1));
}

TEST(ChecksumTest, OneStreamGivesBothWidthsAtEveryLength) {
  // The writers feed one stream and read both digests from it (shard_file_writer.cc): the
  // 128-bit digest of a stream must equal the one-shot XXH3-128, short inputs (which take
  // other code paths) and long ones, fed in pieces that straddle the internal buffer.
  const std::vector<uint8_t> data = xorshift_bytes(3000);
  for (size_t length : {size_t{0}, size_t{1}, size_t{16}, size_t{17}, size_t{128}, size_t{129},
                        size_t{240}, size_t{241}, size_t{1024}, size_t{2999}}) {
    for (size_t piece : {size_t{1}, size_t{7}, size_t{256}, size_t{4096}}) {
      Xxh3Stream stream;
      for (size_t at = 0; at < length; at += piece)
        stream.update(&data[at], std::min(piece, length - at));
      EXPECT_EQ(stream.digest128(), xxh3_128(data.data(), length)) << length << " by " << piece;
      EXPECT_EQ(stream.digest(), xxh3_64(data.data(), length)) << length << " by " << piece;
    }
  }
}

TEST(ChecksumTest, EmptyStreamResetAndMove) {
  Xxh3Stream stream;
  EXPECT_EQ(stream.digest(), 0x2D06800538D394C2u);
  stream.update("abc", 3);
  stream.update(nullptr, 0);
  const uint64_t abc = xxh3_64("abc", 3);
  EXPECT_EQ(stream.digest(), abc);
  EXPECT_EQ(stream.digest(), abc);  // digest() does not consume the state

  Xxh3Stream moved(std::move(stream));
  EXPECT_EQ(moved.digest(), abc);
  Xxh3Stream assigned;
  assigned = std::move(moved);
  assigned.update("d", 1);
  EXPECT_EQ(assigned.digest(), xxh3_64("abcd", 4));
  assigned.reset();
  EXPECT_EQ(assigned.digest(), 0x2D06800538D394C2u);
}

TEST(ChecksumTest, HexFormat) {
  EXPECT_EQ(checksum_to_hex(0), "0000000000000000");
  EXPECT_EQ(checksum_to_hex(0x2D06800538D394C2u), "2d06800538d394c2");
  EXPECT_EQ(checksum_to_hex(UINT64_MAX), "ffffffffffffffff");
  EXPECT_EQ(checksum_to_hex(0xab), "00000000000000ab");
  EXPECT_EQ(kChecksumAlgorithm, "xxh3-64");
}

TEST(ChecksumTest, HexRoundTrip) {
  uint64_t value = 0x9E3779B97F4A7C15u;
  for (int i = 0; i < 1000; ++i) {
    value = value * 6364136223846793005u + 1442695040888963407u;
    std::optional<uint64_t> back = checksum_from_hex(checksum_to_hex(value));
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(*back, value);
  }
  EXPECT_EQ(checksum_from_hex("0000000000000000"), 0u);
  EXPECT_EQ(checksum_from_hex("ffffffffffffffff"), UINT64_MAX);
}

TEST(ChecksumTest, HexRejectsEverythingElse) {
  for (const char* bad : {"", "0", "2d06800538d394c", "2d06800538d394c2a", "2D06800538D394C2",
                          "2d06800538d394cg", "0x06800538d394c2", " d06800538d394c2",
                          "+d06800538d394c2", "-d06800538d394c2", "2d06800538d394c\n"}) {
    EXPECT_FALSE(checksum_from_hex(bad).has_value()) << '"' << bad << '"';
  }
  EXPECT_FALSE(checksum_from_hex(std::string_view("2d06800538d394\0c", 16)).has_value());
}

}  // namespace
}  // namespace fastpersist
