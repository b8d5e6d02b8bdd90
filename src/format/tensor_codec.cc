// SPDX-License-Identifier: Apache-2.0
// Compressed tensor encodings (tensor_codec.h): byte grouping, one zstd or LZ4 frame per chunk
// through the libraries' own APIs, and the chunk table.
#include "fastpersist/tensor_codec.h"

#include <lz4.h>
#include <lz4frame.h>
#include <zstd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <type_traits>

namespace fastpersist {
namespace {

constexpr uint32_t kSkippableMagic = 0x184D2A5E;  // zstd and LZ4 both skip 0x184D2A5?
constexpr uint32_t kTableMagic = 0x54435046;      // "FPCT"
constexpr int kLz4MaxLevel = 12;

void store_le32(uint32_t v, std::byte* p) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}

uint32_t load_le32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint32_t>(p[i]);
  return v;
}

Status damaged(const std::string& what, const std::string& problem) {
  return Status(StatusCode::kDataLoss, what + ": " + problem + ": the checkpoint is damaged");
}

// The transposition as whole-element loads and stores (little-endian: byte j of an element is
// bits 8j..8j+7 of its integer), in blocks of elements so that each of the W planes is read or
// written a few cache lines at a time. Written so that the compiler vectorizes both loops.
template <size_t W>
using Element =
    std::conditional_t<W == 2, uint16_t, std::conditional_t<W == 4, uint32_t, uint64_t>>;

template <size_t W, bool kGroup>
void transpose(const std::byte* src, size_t count, std::byte* dst) {
  static_assert(std::endian::native == std::endian::little, "byte grouping assumes little-endian");
  using E = Element<W>;
  constexpr size_t kBlock = 2048;
  E block[kBlock];
  uint8_t plane[W][kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t n = std::min(kBlock, count - base);
    if constexpr (kGroup) {
      std::memcpy(block, src + base * W, n * W);
      for (size_t j = 0; j < W; ++j) {
        for (size_t i = 0; i < n; ++i) plane[j][i] = static_cast<uint8_t>(block[i] >> (8 * j));
        std::memcpy(dst + j * count + base, plane[j], n);
      }
    } else {
      for (size_t j = 0; j < W; ++j) std::memcpy(plane[j], src + j * count + base, n);
      for (size_t i = 0; i < n; ++i) {
        E e = 0;
        for (size_t j = 0; j < W; ++j) e |= static_cast<E>(static_cast<E>(plane[j][i]) << (8 * j));
        block[i] = e;
      }
      std::memcpy(dst + base * W, block, n * W);
    }
  }
}

}  // namespace

std::string_view compression_name(Compression c) {
  switch (c) {
    case Compression::kZstd:
      return "zstd";
    case Compression::kLz4:
      return "lz4";
    case Compression::kNone:
      break;
  }
  return "none";
}

Result<Compression> parse_compression(std::string_view name) {
  if (name.empty() || name == "none") return Compression::kNone;
  if (name == "zstd") return Compression::kZstd;
  if (name == "lz4") return Compression::kLz4;
  return Status(StatusCode::kInvalidArgument,
                "unknown compression '" + std::string(name) + "' (choose none, zstd or lz4)");
}

std::optional<Compression> compression_of_encoding(std::string_view encoding) {
  if (encoding == "raw") return Compression::kNone;
  if (encoding == kEncodingZstd) return Compression::kZstd;
  if (encoding == kEncodingLz4) return Compression::kLz4;
  return std::nullopt;
}

std::string_view encoding_of(Compression c) {
  return c == Compression::kNone ? std::string_view("raw") : compression_name(c);
}

int default_compression_level(Compression c) { return c == Compression::kZstd ? 1 : 0; }

Status check_compression_level(Compression c, int level) {
  if (c == Compression::kZstd && (level < ZSTD_minCLevel() || level > ZSTD_maxCLevel())) {
    return Status(StatusCode::kInvalidArgument,
                  "zstd compression level must be in " + std::to_string(ZSTD_minCLevel()) + ".." +
                      std::to_string(ZSTD_maxCLevel()) + ", got " + std::to_string(level));
  }
  if (c == Compression::kLz4 && (level < 0 || level > kLz4MaxLevel)) {
    return Status(StatusCode::kInvalidArgument, "lz4 compression level must be in 0.." +
                                                    std::to_string(kLz4MaxLevel) + ", got " +
                                                    std::to_string(level));
  }
  return Status::ok();
}

std::string codec_versions() {
  return std::string("zstd ") + ZSTD_versionString() + ", lz4 " + LZ4_versionString();
}

void xor_into(std::byte* dst, const std::byte* src, size_t bytes) {
  // Word at a time (memcpy keeps it free of alignment and aliasing assumptions); the compiler
  // vectorizes the loop.
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t a, b;
    std::memcpy(&a, dst + i, 8);
    std::memcpy(&b, src + i, 8);
    a ^= b;
    std::memcpy(dst + i, &a, 8);
  }
  for (; i < bytes; ++i) dst[i] ^= src[i];
}

void group_bytes(const std::byte* src, size_t bytes, size_t width, std::byte* dst) {
  const size_t count = width == 0 ? 0 : bytes / width;
  switch (width) {
    case 2:
      transpose<2, true>(src, count, dst);
      return;
    case 4:
      transpose<4, true>(src, count, dst);
      return;
    case 8:
      transpose<8, true>(src, count, dst);
      return;
    case 1:
      std::memcpy(dst, src, bytes);
      return;
    default:
      break;
  }
  for (size_t i = 0; i < count; ++i) {
    for (size_t j = 0; j < width; ++j) dst[j * count + i] = src[i * width + j];
  }
}

void ungroup_bytes(const std::byte* src, size_t bytes, size_t width, std::byte* dst) {
  const size_t count = width == 0 ? 0 : bytes / width;
  switch (width) {
    case 2:
      transpose<2, false>(src, count, dst);
      return;
    case 4:
      transpose<4, false>(src, count, dst);
      return;
    case 8:
      transpose<8, false>(src, count, dst);
      return;
    case 1:
      std::memcpy(dst, src, bytes);
      return;
    default:
      break;
  }
  for (size_t i = 0; i < count; ++i) {
    for (size_t j = 0; j < width; ++j) dst[i * width + j] = src[j * count + i];
  }
}

namespace {

LZ4F_preferences_t lz4_preferences(int level, size_t raw_bytes) {
  LZ4F_preferences_t p;
  std::memset(&p, 0, sizeof(p));
  p.frameInfo.blockSizeID = LZ4F_max4MB;
  p.frameInfo.blockMode = LZ4F_blockIndependent;
  p.frameInfo.contentChecksumFlag = LZ4F_contentChecksumEnabled;
  p.frameInfo.contentSize = raw_bytes;
  p.compressionLevel = level;
  return p;
}

}  // namespace

size_t chunk_frame_bound(Compression c, size_t raw_bytes) {
  if (c == Compression::kLz4) {
    LZ4F_preferences_t p = lz4_preferences(0, raw_bytes);
    return LZ4F_compressFrameBound(raw_bytes, &p);
  }
  return ZSTD_compressBound(raw_bytes);
}

struct ChunkCodec::State {
  ZSTD_CCtx* zc = nullptr;
  ZSTD_DCtx* zd = nullptr;
  LZ4F_cctx* lc = nullptr;
  LZ4F_dctx* ld = nullptr;
  std::unique_ptr<std::byte[]> grouped;
  size_t grouped_bytes = 0;

  ~State() {
    ZSTD_freeCCtx(zc);
    ZSTD_freeDCtx(zd);
    if (lc != nullptr) LZ4F_freeCompressionContext(lc);
    if (ld != nullptr) LZ4F_freeDecompressionContext(ld);
  }
  std::byte* scratch(size_t bytes) {
    if (grouped_bytes < bytes) {
      grouped.reset(new std::byte[bytes]);
      grouped_bytes = bytes;
    }
    return grouped.get();
  }
};

ChunkCodec::ChunkCodec() : state_(std::make_unique<State>()) {}
ChunkCodec::~ChunkCodec() = default;

Result<size_t> ChunkCodec::encode(Compression c, int level, size_t width, const std::byte* raw,
                                  size_t raw_bytes, std::byte* out, size_t out_capacity) {
  if (width == 0 || raw_bytes % width != 0) {
    return Status(StatusCode::kInvalidArgument,
                  "chunk length is not a multiple of the element width");
  }
  const std::byte* input = raw;
  if (width > 1) {
    std::byte* g = state_->scratch(raw_bytes);
    group_bytes(raw, raw_bytes, width, g);
    input = g;
  }
  if (c == Compression::kZstd) {
    if (state_->zc == nullptr && (state_->zc = ZSTD_createCCtx()) == nullptr) {
      return Status(StatusCode::kIoError, "cannot create a zstd context (out of memory)", ENOMEM);
    }
    ZSTD_CCtx_reset(state_->zc, ZSTD_reset_session_and_parameters);
    ZSTD_CCtx_setParameter(state_->zc, ZSTD_c_compressionLevel, level);
    ZSTD_CCtx_setParameter(state_->zc, ZSTD_c_checksumFlag, 1);
    ZSTD_CCtx_setParameter(state_->zc, ZSTD_c_contentSizeFlag, 1);
    size_t n = ZSTD_compress2(state_->zc, out, out_capacity, input, raw_bytes);
    if (ZSTD_isError(n)) {
      return Status(StatusCode::kInternal,
                    std::string("zstd compression failed: ") + ZSTD_getErrorName(n));
    }
    return n;
  }
  if (c == Compression::kLz4) {
    if (state_->lc == nullptr &&
        LZ4F_isError(LZ4F_createCompressionContext(&state_->lc, LZ4F_VERSION))) {
      state_->lc = nullptr;
      return Status(StatusCode::kIoError, "cannot create an lz4 context (out of memory)", ENOMEM);
    }
    // The streaming calls reuse the context (LZ4F_compressFrame would build one per chunk).
    LZ4F_preferences_t p = lz4_preferences(level, raw_bytes);
    size_t done = 0;
    size_t parts[3] = {LZ4F_compressBegin(state_->lc, out, out_capacity, &p), 0, 0};
    if (!LZ4F_isError(parts[0])) {
      done = parts[0];
      parts[1] = LZ4F_compressUpdate(state_->lc, out + done, out_capacity - done, input, raw_bytes,
                                     nullptr);
    }
    if (!LZ4F_isError(parts[0]) && !LZ4F_isError(parts[1])) {
      done += parts[1];
      parts[2] = LZ4F_compressEnd(state_->lc, out + done, out_capacity - done, nullptr);
    }
    for (size_t part : parts) {
      if (LZ4F_isError(part)) {
        return Status(StatusCode::kInternal,
                      std::string("lz4 compression failed: ") + LZ4F_getErrorName(part));
      }
    }
    return done + parts[2];
  }
  return Status(StatusCode::kInvalidArgument, "no codec to encode with");
}

Status ChunkCodec::decode(Compression c, size_t width, const std::byte* frame, size_t frame_bytes,
                          std::byte* raw, size_t raw_bytes) {
  if (width == 0 || raw_bytes % width != 0) {
    return Status(StatusCode::kDataLoss, "chunk length is not a multiple of the element width");
  }
  std::byte* target = width > 1 ? state_->scratch(raw_bytes) : raw;
  if (c == Compression::kZstd) {
    unsigned long long declared = ZSTD_getFrameContentSize(frame, frame_bytes);
    if (declared != raw_bytes) {
      return Status(StatusCode::kDataLoss, "the zstd frame does not declare its chunk's size");
    }
    if (ZSTD_findFrameCompressedSize(frame, frame_bytes) != frame_bytes) {
      return Status(StatusCode::kDataLoss,
                    "the zstd frame does not end where the chunk table says");
    }
    if (state_->zd == nullptr && (state_->zd = ZSTD_createDCtx()) == nullptr) {
      return Status(StatusCode::kIoError, "cannot create a zstd context (out of memory)", ENOMEM);
    }
    size_t n = ZSTD_decompressDCtx(state_->zd, target, raw_bytes, frame, frame_bytes);
    if (ZSTD_isError(n)) {
      return Status(StatusCode::kDataLoss, std::string("zstd: ") + ZSTD_getErrorName(n));
    }
    if (n != raw_bytes)
      return Status(StatusCode::kDataLoss, "the zstd frame decodes to the wrong size");
  } else if (c == Compression::kLz4) {
    if (state_->ld == nullptr &&
        LZ4F_isError(LZ4F_createDecompressionContext(&state_->ld, LZ4F_VERSION))) {
      state_->ld = nullptr;
      return Status(StatusCode::kIoError, "cannot create an lz4 context (out of memory)", ENOMEM);
    }
    LZ4F_resetDecompressionContext(state_->ld);
    size_t in_done = 0;
    size_t out_done = 0;
    size_t hint = 1;
    while (hint != 0) {
      if (in_done == frame_bytes)
        return Status(StatusCode::kDataLoss, "the lz4 frame is truncated");
      size_t in = frame_bytes - in_done;
      size_t out = raw_bytes - out_done;
      LZ4F_decompressOptions_t o;
      std::memset(&o, 0, sizeof(o));
      o.stableDst = 1;
      hint = LZ4F_decompress(state_->ld, target + out_done, &out, frame + in_done, &in, &o);
      if (LZ4F_isError(hint)) {
        LZ4F_resetDecompressionContext(state_->ld);
        return Status(StatusCode::kDataLoss, std::string("lz4: ") + LZ4F_getErrorName(hint));
      }
      if (in == 0 && out == 0 && hint != 0) {
        // No progress: the output is full but the frame wants to write more.
        LZ4F_resetDecompressionContext(state_->ld);
        return Status(StatusCode::kDataLoss, "the lz4 frame decodes to more than its chunk");
      }
      in_done += in;
      out_done += out;
    }
    if (in_done != frame_bytes || out_done != raw_bytes) {
      return Status(StatusCode::kDataLoss, "the lz4 frame does not match its chunk's size");
    }
  } else {
    return Status(StatusCode::kInvalidArgument, "no codec to decode with");
  }
  if (width > 1) ungroup_bytes(target, raw_bytes, width, raw);
  return Status::ok();
}

uint64_t ChunkTable::chunk_raw_bytes(size_t k, uint64_t raw_length) const {
  uint64_t begin = uint64_t{chunk_bytes} * k;
  return std::min<uint64_t>(chunk_bytes, raw_length - begin);
}

uint64_t chunk_count(uint64_t raw_length, uint32_t chunk_bytes) {
  return chunk_bytes == 0 ? 0 : raw_length / chunk_bytes + (raw_length % chunk_bytes != 0);
}

uint64_t chunk_table_bytes(uint64_t chunks) { return 8 + 4 * chunks + kChunkTableTrailerBytes; }

std::string encode_chunk_table(Compression c, uint32_t chunk_bytes, uint8_t width,
                               const std::vector<uint32_t>& frame_bytes) {
  const size_t n = frame_bytes.size();
  std::string out(static_cast<size_t>(chunk_table_bytes(n)), '\0');
  auto* p = reinterpret_cast<std::byte*>(out.data());
  store_le32(kSkippableMagic, p);
  store_le32(static_cast<uint32_t>(4 * n + kChunkTableTrailerBytes), p + 4);
  for (size_t k = 0; k < n; ++k) store_le32(frame_bytes[k], p + 8 + 4 * k);
  std::byte* t = p + 8 + 4 * n;
  store_le32(chunk_bytes, t);
  store_le32(static_cast<uint32_t>(n), t + 4);
  t[8] = static_cast<std::byte>(width);
  t[9] = static_cast<std::byte>(kCodecTableVersion);
  t[10] = static_cast<std::byte>(c);
  t[11] = std::byte{0};
  store_le32(kTableMagic, t + 12);
  return out;
}

Result<uint64_t> chunk_table_size(const std::byte* trailer, uint64_t stored_length) {
  if (stored_length < chunk_table_bytes(0)) {
    return Status(StatusCode::kDataLoss, "too short to hold a chunk table");
  }
  if (load_le32(trailer + 12) != kTableMagic) {
    return Status(StatusCode::kDataLoss, "the chunk table's trailer is missing");
  }
  uint64_t n = load_le32(trailer + 4);
  uint64_t bytes = chunk_table_bytes(n);
  if (bytes > stored_length)
    return Status(StatusCode::kDataLoss, "the chunk table is longer than the tensor");
  return bytes;
}

Result<ChunkTable> parse_chunk_table(const std::byte* table, uint64_t table_bytes, Compression c,
                                     size_t width, uint64_t raw_length, uint64_t stored_length,
                                     const std::string& what) {
  if (table_bytes < chunk_table_bytes(0) || table_bytes > stored_length) {
    return damaged(what, "the chunk table does not fit the stored bytes");
  }
  const std::byte* t = table + table_bytes - kChunkTableTrailerBytes;
  if (load_le32(t + 12) != kTableMagic || load_le32(table) != kSkippableMagic) {
    return damaged(what, "the chunk table's magic numbers are wrong");
  }
  ChunkTable out;
  out.compression = c;
  out.chunk_bytes = load_le32(t);
  uint64_t n = load_le32(t + 4);
  out.width = static_cast<uint8_t>(t[8]);
  if (static_cast<uint8_t>(t[9]) != kCodecTableVersion) {
    return damaged(what, "chunk table version " + std::to_string(static_cast<unsigned>(t[9])) +
                             " (this fastpersist reads " + std::to_string(kCodecTableVersion) +
                             ")");
  }
  if (static_cast<uint8_t>(t[10]) != static_cast<uint8_t>(c)) {
    return damaged(what, "the chunk table names another codec than the manifest");
  }
  if (chunk_table_bytes(n) != table_bytes ||
      load_le32(table + 4) != 4 * n + kChunkTableTrailerBytes) {
    return damaged(what, "the chunk table's size fields disagree");
  }
  if (out.width != width) {
    return damaged(what, "byte grouping width " + std::to_string(out.width) + " for elements of " +
                             std::to_string(width) + " bytes");
  }
  if (out.chunk_bytes == 0 || out.chunk_bytes > kCodecMaxChunkBytes ||
      out.chunk_bytes % width != 0) {
    return damaged(what, "chunk size " + std::to_string(out.chunk_bytes) + " is not allowed");
  }
  if (n != chunk_count(raw_length, out.chunk_bytes)) {
    return damaged(what, std::to_string(n) + " chunks for " + std::to_string(raw_length) +
                             " bytes in chunks of " + std::to_string(out.chunk_bytes));
  }
  out.table_bytes = table_bytes;
  out.frame_offsets.resize(static_cast<size_t>(n) + 1);
  uint64_t at = 0;
  for (size_t k = 0; k < n; ++k) {
    uint32_t size = load_le32(table + 8 + 4 * k);
    if (size == 0) return damaged(what, "chunk " + std::to_string(k) + " has an empty frame");
    out.frame_offsets[k] = at;
    at += size;
  }
  out.frame_offsets[static_cast<size_t>(n)] = at;
  if (at + table_bytes != stored_length) {
    return damaged(what, "the frames and the chunk table take " + std::to_string(at + table_bytes) +
                             " bytes, the manifest says " + std::to_string(stored_length));
  }
  return out;
}

}  // namespace fastpersist
