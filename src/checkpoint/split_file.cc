// SPDX-License-Identifier: Apache-2.0
// Split files (split_file.h): serialized files stored as a skeleton plus checkpoint tensors.
#include "fastpersist/split_file.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
#include <unordered_map>
#include <utility>

#include "checkpoint_dir/checkpoint_fs.h"
#include "fastpersist/checkpoint_commit.h"
#include "fastpersist/checkpoint_load.h"
#include "fastpersist/checksum.h"
#include "fastpersist/fast_file_writer.h"
#include "fastpersist/layout.h"
#include "incremental/incremental.h"

namespace fastpersist {
namespace {

constexpr size_t kHeaderBytes = 8 + 8 + 8;  // magic, size, count
constexpr size_t kPieceBytes = 16;          // offset, length
// The file data a read keeps in flight (LoadRequest::max_memory): a compressed piece larger
// than half of it is decoded in a stream straight into its destination, instead of whole in
// new memory first (which would hold the piece twice, and its stored bytes, at once).
constexpr uint64_t kReadMemoryBytes = uint64_t{256} << 20;
// What write_plain_file streams at a time.
constexpr uint64_t kStreamChunkBytes = uint64_t{8} << 20;

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

Status damaged(const std::string& path, const std::string& why) {
  return Status(StatusCode::kDataLoss, "the split file's skeleton is damaged: " + why)
      .with_path(path);
}

}  // namespace

std::string split_piece_name(std::string_view file, size_t index) {
  return std::string(file) + "#" + std::to_string(index);
}

bool is_split_skeleton(std::string_view head) {
  return head.size() >= kSplitFileMagic.size() &&
         head.substr(0, kSplitFileMagic.size()) == kSplitFileMagic;
}

std::string encode_split_skeleton(uint64_t size, const std::vector<SplitPiece>& pieces,
                                  std::string_view rest) {
  std::string out;
  out.reserve(kHeaderBytes + kPieceBytes * pieces.size() + rest.size());
  out.append(kSplitFileMagic);
  put_u64(out, size);
  put_u64(out, pieces.size());
  for (const SplitPiece& p : pieces) {
    put_u64(out, p.offset);
    put_u64(out, p.length);
  }
  out.append(rest);
  return out;
}

Result<SplitSkeleton> decode_split_skeleton(std::string_view bytes, const std::string& path) {
  if (!is_split_skeleton(bytes))
    return damaged(path, "it does not start with " + std::string(kSplitFileMagic));
  if (bytes.size() < kHeaderBytes) return damaged(path, "its header is cut short");
  SplitSkeleton s;
  s.size = get_u64(bytes.data() + 8);
  const uint64_t count = get_u64(bytes.data() + 16);
  // The count is checked against the bytes present before the table is allocated.
  if (count > (bytes.size() - kHeaderBytes) / kPieceBytes) {
    return damaged(path, "it claims " + std::to_string(count) + " pieces, more than its " +
                             std::to_string(bytes.size()) + " bytes can hold");
  }
  s.pieces.reserve(static_cast<size_t>(count));
  uint64_t end = 0;  // of the previous piece
  uint64_t pieces_bytes = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const char* p = bytes.data() + kHeaderBytes + i * kPieceBytes;
    SplitPiece piece{get_u64(p), get_u64(p + 8)};
    if (piece.length == 0 || piece.offset < end || piece.offset > s.size ||
        piece.length > s.size - piece.offset) {
      return damaged(path, "piece " + std::to_string(i) + " (offset " +
                               std::to_string(piece.offset) + ", length " +
                               std::to_string(piece.length) +
                               ") is empty, out of order, overlaps or ends past the " +
                               std::to_string(s.size) + "-byte file");
    }
    end = piece.offset + piece.length;
    pieces_bytes += piece.length;
    s.pieces.push_back(piece);
  }
  s.rest = bytes.substr(kHeaderBytes + count * kPieceBytes);
  if (s.size - pieces_bytes != s.rest.size()) {
    return damaged(path, "the file is " + std::to_string(s.size) + " bytes, its pieces " +
                             std::to_string(pieces_bytes) + " and the other bytes " +
                             std::to_string(s.rest.size()));
  }
  return s;
}

Result<SplitWriteResult> write_split_files(const std::string& directory,
                                           const std::vector<DeferredFileWriter*>& files,
                                           ShardWriter& writer,
                                           const std::optional<SplitBase>& base) {
  std::set<std::string> names;
  std::vector<DeferredStream> streams;
  streams.reserve(files.size());
  for (DeferredFileWriter* f : files) {
    if (f == nullptr)
      return Status(StatusCode::kInvalidArgument, "write_split_files: a null writer");
    FP_ASSIGN_OR_RETURN(DeferredStream s, f->take_pieces());
    if (!names.insert(s.name).second) {
      return Status(StatusCode::kInvalidArgument, "two split files are named '" + s.name + "'")
          .with_path(directory);
    }
    streams.push_back(std::move(s));
  }
  std::vector<TensorSource> tensors;
  for (const DeferredStream& s : streams) {
    for (size_t k = 0; k < s.borrowed.size(); ++k) {
      TensorSource t;
      t.name = split_piece_name(s.name, k);
      t.dtype = "U8";
      t.shape = {s.borrowed[k].bytes};
      t.data = s.borrowed[k].data;
      t.nbytes = s.borrowed[k].bytes;
      tensors.push_back(std::move(t));
    }
  }
  checkpoint::IncrementalBase incremental;
  if (base) {
    incremental.tag = base->tag;
    incremental.dir = checkpoint::join_path(base->root, base->tag);
    auto opened = CheckpointReader::open(
        incremental.dir, std::shared_ptr<IoEngine>(&writer.engine(), [](IoEngine*) {}));
    if (!opened.is_ok()) {
      return Status(StatusCode::kInvalidArgument,
                    "the base checkpoint '" + base->tag +
                        "' of an incremental save cannot be read: " + opened.status().message())
          .with_path(incremental.dir);
    }
    incremental.manifest = std::make_shared<const Manifest>((*opened)->manifest());
  }
  const ShardWriterOptions& o = writer.options();
  SplitWriteResult out;
  if (!tensors.empty()) {
    FP_ASSIGN_OR_RETURN(checkpoint::TensorWrite written,
                        checkpoint::write_tensors(writer, directory, tensors, nullptr,
                                                  base ? &incremental : nullptr,
                                                  /*xor_deltas=*/false, o.compression_threads));
    out.files = std::move(written.data.files);
    out.tensors = std::move(written.data.tensors);
    out.bytes_written = written.data.bytes_written;
    out.references_base = written.references_base;
    out.referenced_bytes = written.referenced_bytes;
  }
  for (const DeferredStream& s : streams) {
    std::vector<SplitPiece> pieces;
    pieces.reserve(s.borrowed.size());
    for (const DeferredStream::Borrowed& b : s.borrowed) pieces.push_back({b.offset, b.bytes});
    std::string skeleton = encode_split_skeleton(s.size, pieces, s.rest);
    FP_ASSIGN_OR_RETURN(ManifestFile record, write_sidecar_file(directory, s.name, skeleton,
                                                                o.durable, o.checksums, o.rank));
    out.bytes_written += skeleton.size();
    out.files.push_back(std::move(record));
  }
  return out;
}

SplitFileReader::SplitFileReader(CheckpointReader* reader, std::string name, std::string bytes,
                                 uint64_t size, std::vector<SplitPiece> pieces,
                                 std::vector<size_t> piece_tensors, size_t rest_offset)
    : reader_(reader),
      name_(std::move(name)),
      bytes_(std::move(bytes)),
      size_(size),
      pieces_(std::move(pieces)),
      piece_tensors_(std::move(piece_tensors)),
      rest_offset_(rest_offset) {
  uint64_t before = 0;
  pieces_before_.reserve(pieces_.size());
  for (const SplitPiece& p : pieces_) {
    pieces_before_.push_back(before);
    before += p.length;
  }
}

Result<SplitFileReader> SplitFileReader::open(CheckpointReader& reader, const std::string& name) {
  const std::string path = checkpoint::join_path(reader.dir(), name);
  FP_ASSIGN_OR_RETURN(std::string bytes, reader.read_file(name));
  if (!is_split_skeleton(bytes)) {
    return Status(StatusCode::kInvalidArgument, "not a split file (a plain one: read it as it is)")
        .with_path(path);
  }
  FP_ASSIGN_OR_RETURN(SplitSkeleton skeleton, decode_split_skeleton(bytes, path));
  const Manifest& m = reader.manifest();
  std::unordered_map<std::string_view, size_t> by_name;
  for (size_t i = 0; i < m.tensors.size(); ++i) by_name.emplace(m.tensors[i].name, i);
  std::vector<size_t> piece_tensors;
  piece_tensors.reserve(skeleton.pieces.size());
  for (size_t k = 0; k < skeleton.pieces.size(); ++k) {
    const std::string piece = split_piece_name(name, k);
    auto found = by_name.find(piece);
    if (found == by_name.end()) {
      return Status(StatusCode::kDataLoss,
                    "the manifest has no tensor '" + piece + "' for piece " + std::to_string(k))
          .with_path(path);
    }
    const ManifestTensor& t = m.tensors[found->second];
    piece_tensors.push_back(found->second);
    const uint64_t length = skeleton.pieces[k].length;
    if (t.dtype != "U8" || t.shape != std::vector<uint64_t>{length} || t.length != length) {
      return Status(StatusCode::kDataLoss, "the manifest's tensor '" + piece + "' is not " +
                                               std::to_string(length) +
                                               " bytes of U8, as the skeleton says")
          .with_path(path);
    }
  }
  const size_t rest_offset = bytes.size() - skeleton.rest.size();
  return SplitFileReader(&reader, name, std::move(bytes), skeleton.size, std::move(skeleton.pieces),
                         std::move(piece_tensors), rest_offset);
}

Status SplitFileReader::read_into(std::byte* out, uint64_t capacity, bool verify) const {
  if (out == nullptr || capacity < size_) {
    return Status(StatusCode::kInvalidArgument, "read_into: " + std::to_string(capacity) +
                                                    " bytes of room for a " +
                                                    std::to_string(size_) + "-byte file");
  }
  return read_range(0, out, static_cast<size_t>(size_), verify);  // every piece whole: one load
}

Status SplitFileReader::read_range(uint64_t offset, std::byte* out, size_t n, bool verify) const {
  if (offset > size_ || n > size_ - offset || (out == nullptr && n > 0)) {
    return Status(StatusCode::kInvalidArgument, "read_range: bytes [" + std::to_string(offset) +
                                                    ", +" + std::to_string(n) + ") of a " +
                                                    std::to_string(size_) + "-byte file");
  }
  const uint64_t end = offset + n;
  // The first piece that ends after `offset`.
  size_t k = static_cast<size_t>(
      std::upper_bound(pieces_.begin(), pieces_.end(), offset,
                       [](uint64_t at, const SplitPiece& p) { return at < p.offset + p.length; }) -
      pieces_.begin());
  LoadRequest whole;  // the pieces covered whole, loaded together
  whole.names.emplace();
  whole.into = true;
  whole.strict = true;
  whole.verify = verify;
  whole.max_memory = kReadMemoryBytes;
  uint64_t at = offset;
  while (at < end) {
    if (k == pieces_.size() || at < pieces_[k].offset) {
      // Other bytes, up to the next piece: at file position p they are at rest index
      // p - (the pieces' bytes before p).
      const uint64_t until = k == pieces_.size() ? end : std::min(end, pieces_[k].offset);
      const uint64_t before =
          k == pieces_.size() ? size_ - (bytes_.size() - rest_offset_) : pieces_before_[k];
      std::memcpy(out + (at - offset), bytes_.data() + rest_offset_ + (at - before),
                  static_cast<size_t>(until - at));
      at = until;
      continue;
    }
    const SplitPiece& p = pieces_[k];
    const uint64_t until = std::min(end, p.offset + p.length);
    const std::string name = split_piece_name(name_, k);
    if (at == p.offset && until == p.offset + p.length) {
      whole.names->push_back(name);
      LoadDestination d;
      d.name = name;
      d.data = out + (at - offset);
      d.capacity_bytes = p.length;
      d.dtype = "U8";
      d.shape = {p.length};
      whole.destinations.push_back(std::move(d));
    } else {
      std::vector<std::byte> piece(static_cast<size_t>(p.length));
      FP_RETURN_IF_ERROR(read_range(p.offset, piece.data(), piece.size(), verify));
      std::memcpy(out + (at - offset), piece.data() + (at - p.offset),
                  static_cast<size_t>(until - at));
    }
    at = until;
    ++k;
  }
  if (!whole.destinations.empty()) FP_RETURN_IF_ERROR(reader_->load(whole).status());
  return Status::ok();
}

Status SplitFileReader::stream(uint64_t chunk_bytes, bool verify,
                               const std::function<Status(const std::byte*, size_t)>& sink) const {
  if (chunk_bytes == 0 || chunk_bytes % 4096 != 0) {
    return Status(StatusCode::kInvalidArgument,
                  "stream: chunk_bytes must be a positive multiple of 4096");
  }
  uint64_t at = 0;
  size_t rest = rest_offset_;
  auto other_bytes = [&](uint64_t until) -> Status {
    while (at < until) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk_bytes, until - at));
      FP_RETURN_IF_ERROR(sink(reinterpret_cast<const std::byte*>(bytes_.data()) + rest, n));
      rest += n;
      at += n;
    }
    return Status::ok();
  };
  for (size_t k = 0; k < pieces_.size(); ++k) {
    FP_RETURN_IF_ERROR(other_bytes(pieces_[k].offset));
    FP_RETURN_IF_ERROR(reader_->read_pieces(
        piece_tensors_[k], chunk_bytes, verify,
        [&](uint64_t, const std::byte* data, size_t n) { return sink(data, n); }));
    at += pieces_[k].length;
  }
  return other_bytes(size_);
}

Result<ManifestFile> write_plain_file(const SplitFileReader& split, const std::string& directory,
                                      bool durable, bool checksums, std::optional<uint32_t> rank) {
  const std::string path = checkpoint::join_path(directory, split.name());
  FastFileWriterOptions o;
  o.durable = durable;
  FP_ASSIGN_OR_RETURN(std::unique_ptr<FastFileWriter> out, FastFileWriter::open(path, o));
  Xxh3Stream hash;
  uint64_t size = 0;
  Status st =
      split.stream(kStreamChunkBytes, /*verify=*/true, [&](const std::byte* data, size_t n) {
        if (checksums) hash.update(data, n);
        size += n;
        return out->write(data, n);
      });
  if (st.is_ok()) st = out->close();
  if (!st.is_ok()) {
    out->abort();
    return st;
  }
  ManifestFile record;
  record.name = split.name();
  record.role = "objects";
  record.size = size;
  record.checksum = checksums ? hash.digest() : 0;
  record.checksum_bytes = size;
  record.rank = rank;
  return record;
}

}  // namespace fastpersist
