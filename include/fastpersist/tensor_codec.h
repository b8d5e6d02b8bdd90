// SPDX-License-Identifier: Apache-2.0
// Lossless compressed encodings of a tensor's bytes (manifest `encoding` "zstd" and "lz4";
// docs/format.md, "Compressed tensors"). The tensor's raw bytes are cut into chunks of
// `chunk_bytes` (kCodecChunkBytes, 4 MiB; the last may be shorter). Each chunk is byte-grouped
// by element width (all first bytes of its elements, then all second bytes, ...) and compressed
// into one independent standard frame: a zstd frame, or an LZ4 frame, with the codec's own
// content checksum. The stored bytes of the tensor are the frames in chunk order, followed by
// the chunk table in a skippable frame (which both codecs' decoders skip):
//
//   frame 0 | frame 1 | ... | frame n-1 | table
//   table = u32 0x184D2A5E (skippable-frame magic) | u32 payload bytes (4 n + 16)
//         | u32 frame bytes, n times
//         | u32 chunk_bytes | u32 n | u8 group width | u8 version (1) | u8 codec (1 zstd, 2 lz4)
//         | u8 0 | u32 "FPCT"                                         (all little-endian)
//
// So `zstd -dc` (or `lz4 -dc`) of the stored bytes gives the byte-grouped chunks one after the
// other, and frames can be decoded in parallel, or only those a bounded load needs.
// Checksums in the manifest cover the raw bytes, as for raw tensors.
//
// Every decoder here treats the stored bytes as hostile: a table that does not add up, a frame
// that does not decode to exactly its chunk, or fails the codec's checksum, is kDataLoss;
// nothing is ever written past the raw length the manifest gives.
//
// Thread-safety: free functions are pure; a ChunkCodec belongs to one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fastpersist/status.h"

namespace fastpersist {

enum class Compression : uint8_t { kNone = 0, kZstd = 1, kLz4 = 2 };

inline constexpr std::string_view kEncodingZstd = "zstd";
inline constexpr std::string_view kEncodingLz4 = "lz4";
// An XOR delta against the base checkpoint's tensor (manifest.h, DeltaBase): the frames and the
// table are those of "zstd" (codec byte 1), over the byte-grouped XOR of the raw bytes with
// the base's raw bytes, chunk by chunk. compression_of_encoding() does not map it: a reader
// that does not apply the base refuses it instead of returning the XOR.
inline constexpr std::string_view kEncodingXorZstd = "xor-zstd";

// "none", "zstd", "lz4".
std::string_view compression_name(Compression compression);
// "none" (or "") / "zstd" / "lz4"; kInvalidArgument listing the choices otherwise.
Result<Compression> parse_compression(std::string_view name);
// The codec a manifest encoding names: "raw" -> kNone, "zstd", "lz4"; nullopt for others.
std::optional<Compression> compression_of_encoding(std::string_view encoding);
// The manifest encoding of a codec ("raw" for kNone).
std::string_view encoding_of(Compression compression);

// The level a save uses when none is given: zstd 1, lz4 0 (its fast mode).
int default_compression_level(Compression compression);
// zstd: ZSTD_minCLevel()..ZSTD_maxCLevel() (negative levels are faster); lz4: 0..12 (3 and up
// use LZ4-HC). kInvalidArgument names the range.
Status check_compression_level(Compression compression, int level);
// The libraries linked in, e.g. "zstd 1.5.4, lz4 1.9.4" (for `fastpersist report`).
std::string codec_versions();

inline constexpr uint32_t kCodecChunkBytes = uint32_t{4} << 20;
inline constexpr uint32_t kCodecMaxChunkBytes = uint32_t{64} << 20;  // what a reader accepts
inline constexpr uint8_t kCodecTableVersion = 1;
inline constexpr size_t kChunkTableTrailerBytes = 16;

// The most raw bytes one stored byte of either codec can decode to. zstd's densest block is an
// RLE block: 4 bytes for at most 128 KiB (the format's largest block), a ratio of 32768; lz4
// stays near 255. A manifest that claims more raw bytes than this allows for its stored bytes is
// damage, refused before anything of the claimed size is allocated (docs/reliability.md).
inline constexpr uint64_t kCodecMaxExpansion = 32768;
// Whether `stored_length` encoded bytes can decode to `raw_length` bytes (without overflow).
constexpr bool codec_expansion_possible(uint64_t raw_length, uint64_t stored_length) {
  return raw_length / kCodecMaxExpansion + (raw_length % kCodecMaxExpansion != 0) <= stored_length;
}

// dst[i] ^= src[i] for `bytes` bytes.
void xor_into(std::byte* dst, const std::byte* src, size_t bytes);

// Byte grouping of `bytes` bytes (a multiple of `width`, 1..16) from `src` into `dst`, and back.
void group_bytes(const std::byte* src, size_t bytes, size_t width, std::byte* dst);
void ungroup_bytes(const std::byte* src, size_t bytes, size_t width, std::byte* dst);

// The largest frame one chunk of `raw_bytes` can become.
size_t chunk_frame_bound(Compression compression, size_t raw_bytes);

// Reusable compression and decompression state plus a grouping buffer (one per thread).
class ChunkCodec {
 public:
  ChunkCodec();
  ~ChunkCodec();
  ChunkCodec(const ChunkCodec&) = delete;
  ChunkCodec& operator=(const ChunkCodec&) = delete;

  // Groups and compresses `raw_bytes` bytes (a multiple of `width`) into `out` (at least
  // chunk_frame_bound bytes); returns the frame's size.
  Result<size_t> encode(Compression compression, int level, size_t width, const std::byte* raw,
                        size_t raw_bytes, std::byte* out, size_t out_capacity);
  // Decodes one frame into exactly `raw_bytes` bytes at `raw`: kDataLoss when the frame is
  // damaged, fails its checksum, or gives any other number of bytes.
  Status decode(Compression compression, size_t width, const std::byte* frame, size_t frame_bytes,
                std::byte* raw, size_t raw_bytes);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Where each chunk's frame lies in a tensor's stored bytes (offsets from their start).
struct ChunkTable {
  Compression compression = Compression::kZstd;
  uint32_t chunk_bytes = kCodecChunkBytes;
  uint8_t width = 1;
  std::vector<uint64_t> frame_offsets;  // n + 1 entries; frame k is [offsets[k], offsets[k+1])
  uint64_t table_bytes = 0;             // the skippable frame at the end
  size_t chunks() const { return frame_offsets.empty() ? 0 : frame_offsets.size() - 1; }
  // Raw bytes of chunk k of a tensor of `raw_length` bytes.
  uint64_t chunk_raw_bytes(size_t k, uint64_t raw_length) const;
};

// Chunks of a tensor of `raw_length` bytes, and the size of its table.
uint64_t chunk_count(uint64_t raw_length, uint32_t chunk_bytes);
uint64_t chunk_table_bytes(uint64_t chunks);

// The table to append after the frames of `frame_bytes` (one entry per chunk).
std::string encode_chunk_table(Compression compression, uint32_t chunk_bytes, uint8_t width,
                               const std::vector<uint32_t>& frame_bytes);

// From the last kChunkTableTrailerBytes of a tensor's stored bytes: how many bytes its whole
// table takes (read them, then call parse_chunk_table). kDataLoss when the trailer is not one,
// or names more table than `stored_length` holds.
Result<uint64_t> chunk_table_size(const std::byte* trailer, uint64_t stored_length);
// Parses and checks the table (`table`, `table_bytes` long, the end of the stored bytes) of a
// tensor stored with `compression`, `raw_length` raw bytes of elements of `width` bytes in
// `stored_length` stored bytes: magic, version, codec, width, chunk size (width-multiple, at
// most kCodecMaxChunkBytes), chunk count, nonzero frames adding up to the stored bytes.
// `what` names the tensor in messages.
Result<ChunkTable> parse_chunk_table(const std::byte* table, uint64_t table_bytes,
                                     Compression compression, size_t width, uint64_t raw_length,
                                     uint64_t stored_length, const std::string& what);

}  // namespace fastpersist
