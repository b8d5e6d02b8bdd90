// SPDX-License-Identifier: Apache-2.0
// The decoders of compressed tensors (tensor_codec.h, load/encoded_read.h) on hostile
// stored bytes. The first byte picks the codec (bit 0), the element width (bits 1-2: 1, 2, 4, 8)
// and the mode (bit 7):
//   decode mode: the rest is a tensor's stored bytes, its raw length taken from the next two
//     bytes; the table is parsed from the end and every chunk decoded, both from memory and as
//     a FrameStream fed in uneven pieces. Either fails with a Status or gives exactly the raw
//     length, and both ways agree.
//   round-trip mode: the rest is raw bytes, encoded in chunks of 4096 into stored bytes, then
//     decoded (bit-identical), then one byte of the stored bytes flipped and decoded again
//     (a Status, or the same bytes when the flip hit a byte no decoder reads).
#include <cstring>
#include <string>
#include <vector>

#include "fastpersist/manifest.h"
#include "fastpersist/tensor_codec.h"
#include "fuzz_target.h"
#include "load/encoded_read.h"

namespace {

using fastpersist::ChunkCodec;
using fastpersist::Compression;
using fastpersist::ManifestTensor;
using fastpersist::Status;

constexpr const char* kDtypes[] = {"U8", "BF16", "F32", "F64"};

// Decodes `stored` into raw bytes both ways; nullopt-like empty flag on failure.
bool decode_both(const ManifestTensor& t, const std::vector<std::byte>& stored,
                 std::vector<std::byte>* raw, size_t piece) {
  auto table = fastpersist::checkpoint::chunk_table_in_memory(t, stored.data());
  if (!table.is_ok()) return false;
  raw->assign(static_cast<size_t>(t.length), std::byte{0});
  ChunkCodec codec;
  bool ok = true;
  for (size_t k = 0; k < table->chunks() && ok; ++k) {
    uint64_t begin = table->frame_offsets[k];
    ok = codec
             .decode(table->compression, table->width, stored.data() + begin,
                     static_cast<size_t>(table->frame_offsets[k + 1] - begin),
                     raw->data() + uint64_t{table->chunk_bytes} * k,
                     static_cast<size_t>(table->chunk_raw_bytes(k, t.length)))
             .is_ok();
  }
  std::vector<std::byte> streamed;
  fastpersist::checkpoint::FrameStream frames(t, *table,
                                              [&](uint64_t offset, const std::byte* d, size_t n) {
                                                FUZZ_CHECK(offset == streamed.size());
                                                streamed.insert(streamed.end(), d, d + n);
                                                return Status::ok();
                                              });
  bool stream_ok = true;
  for (size_t at = 0; at < stored.size() && stream_ok; at += piece) {
    stream_ok = frames.feed(stored.data() + at, std::min(piece, stored.size() - at)).is_ok();
  }
  stream_ok = stream_ok && frames.finish().is_ok();
  FUZZ_CHECK(ok == stream_ok);
  if (ok) FUZZ_CHECK(streamed == *raw);
  return ok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const Compression codec = (data[0] & 1) ? Compression::kLz4 : Compression::kZstd;
  const size_t width_index = (data[0] >> 1) & 3;
  const size_t width = size_t{1} << width_index;
  const bool round_trip = (data[0] & 0x80) != 0;
  ManifestTensor t;
  t.name = "fuzz";
  t.file = "fuzz.safetensors";
  t.dtype = kDtypes[width_index];
  t.encoding = std::string(fastpersist::encoding_of(codec));
  const size_t piece = 1 + data[1] % 97;
  if (!round_trip) {
    t.length = (uint64_t{data[1]} << 8 | data[2]) * width;
    std::vector<std::byte> stored(size - 3);
    if (!stored.empty())
      std::memcpy(stored.data(), data + 3, stored.size());  // empty: data() may be null
    t.stored_length = stored.size();
    std::vector<std::byte> raw;
    (void)decode_both(t, stored, &raw, piece);
    return 0;
  }
  std::vector<std::byte> raw((size - 3) / width * width);
  if (!raw.empty()) std::memcpy(raw.data(), data + 3, raw.size());
  t.length = raw.size();
  constexpr uint32_t kChunk = 4096;
  ChunkCodec c;
  std::vector<std::byte> stored;
  std::vector<uint32_t> frames;
  for (uint64_t at = 0; at < raw.size(); at += kChunk) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, raw.size() - at));
    std::vector<std::byte> frame(fastpersist::chunk_frame_bound(codec, n));
    auto written =
        c.encode(codec, data[2] % 4, width, raw.data() + at, n, frame.data(), frame.size());
    FUZZ_CHECK(written.is_ok());
    stored.insert(stored.end(), frame.begin(), frame.begin() + static_cast<long>(*written));
    frames.push_back(static_cast<uint32_t>(*written));
  }
  std::string table =
      fastpersist::encode_chunk_table(codec, kChunk, static_cast<uint8_t>(width), frames);
  const auto* tb = reinterpret_cast<const std::byte*>(table.data());
  stored.insert(stored.end(), tb, tb + table.size());
  t.stored_length = stored.size();
  std::vector<std::byte> back;
  FUZZ_CHECK(decode_both(t, stored, &back, piece));
  FUZZ_CHECK(back == raw);
  size_t flip = (size_t{data[1]} * 131 + data[2]) % stored.size();
  stored[flip] ^= std::byte{0x20};
  if (decode_both(t, stored, &back, piece)) {
    // Only a byte no decoder checks (zstd's unused header bits...) may flip unnoticed, and then
    // the bytes must still be the raw ones: both codecs check a content checksum.
    FUZZ_CHECK(back == raw);
  }
  return 0;
}
