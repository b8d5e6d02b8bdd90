// SPDX-License-Identifier: Apache-2.0
// Split files: a serialized file (a DeepSpeed checkpoint's .pt, as torch.save pickled it into a
// DeferredFileWriter) stored so that its tensor storages can be compressed and saved
// incrementally like any checkpoint tensor, and reassembled byte for byte when it is read.
//
// A file <name> is stored as
//   - its large borrowed pieces (the storages the serializer wrote from lent memory): tensors
//     "<name>#<k>" of the checkpoint, dtype U8, shape [length], k = 0, 1, ... in stream order,
//     written by a ShardWriter (so compressed, referenced from a base, checksummed);
//   - a skeleton file <name> (role "objects", checksummed as a whole) with everything else:
//       "FPSPLIT1"                          8 bytes, the format
//       u64 size                            the reassembled file's length
//       u64 count                           how many pieces
//       count x (u64 offset, u64 length)    where each piece goes in the file, ascending
//       the other bytes, in file order      (size - the pieces' lengths) bytes
//     all integers little-endian.
// A skeleton is not a file torch.load reads: a checkpoint stored this way needs fastpersist (or
// `fastpersist convert` back to plain files) to load. docs/integrations.md says so.
//
// A checkpoint on disk is untrusted: decoding checks every field against the skeleton's real
// length and the manifest's tensors before anything is allocated.
//
// Thread-safety: free functions; a SplitFileReader is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/deferred_file_writer.h"
#include "fastpersist/manifest.h"
#include "fastpersist/shard_writer.h"
#include "fastpersist/status.h"

namespace fastpersist {

inline constexpr std::string_view kSplitFileMagic = "FPSPLIT1";

// The tensor that holds piece `index` of split file `file`: "<file>#<index>".
std::string split_piece_name(std::string_view file, size_t index);

struct SplitPiece {
  uint64_t offset = 0;  // in the reassembled file
  uint64_t length = 0;
};

// A decoded skeleton; `rest` points into the bytes it was decoded from.
struct SplitSkeleton {
  uint64_t size = 0;
  std::vector<SplitPiece> pieces;
  std::string_view rest;
};

std::string encode_split_skeleton(uint64_t size, const std::vector<SplitPiece>& pieces,
                                  std::string_view rest);
// kDataLoss naming `path` for anything but a well-formed skeleton: a short header, a count the
// bytes cannot hold, pieces out of order, overlapping or past the end, lengths that do not add
// up to `size` with the other bytes.
Result<SplitSkeleton> decode_split_skeleton(std::string_view bytes, const std::string& path);

// What one rank's split files became: the records its coordinator commits.
struct SplitWriteResult {
  std::vector<ManifestFile> files;      // skeletons, data files, referenced base files
  std::vector<ManifestTensor> tensors;  // the pieces
  uint64_t bytes_written = 0;           // data files and skeletons
  uint64_t referenced_bytes = 0;        // pieces recorded as references to the base
  bool references_base = false;
};

// A full checkpoint in `root` (its directory <root>/<tag>) that the pieces are compared
// against: equal pieces (name, length and XXH3-128) become references to its bytes.
struct SplitBase {
  std::string root;
  std::string tag;
};

// Writes `files` (each finished with write(), none persisted) into `directory` as split files:
// every file's borrowed pieces in one ShardWriter write (compressed as the writer's options
// say; against `base` when given: incremental.h, a base piece referenced only once its bytes
// were read and found to match its records), then one skeleton per file. Each writer is
// finished afterwards (as by persist()); the lent memory must stay alive and unchanged until
// this returns. On failure the files written so far stay in `directory`: the caller's commit
// aborts (removing the directory). kInvalidArgument: a writer already finished, two with one
// name, a base whose manifest does not decode.
Result<SplitWriteResult> write_split_files(const std::string& directory,
                                           const std::vector<DeferredFileWriter*>& files,
                                           ShardWriter& writer,
                                           const std::optional<SplitBase>& base);

// Reads a split file of a committed checkpoint back into the bytes the serializer produced.
class SplitFileReader {
 public:
  // Reads and checks the skeleton `name` (its checksum, its fields, and that every piece is a
  // U8 tensor of the manifest with its length): kNotFound when the manifest lists no such
  // file, kDataLoss for a damaged one.
  // kInvalidArgument when the file is a plain one, not a skeleton.
  static Result<SplitFileReader> open(CheckpointReader& reader, const std::string& name);
  uint64_t size() const { return size_; }
  // The whole file into [out, out + capacity) (capacity >= size()); with `verify`, each
  // piece's checksum is checked (kDataLoss naming its tensor).
  Status read_into(std::byte* out, uint64_t capacity, bool verify) const;
  // Bytes [offset, offset + n) of the file into `out` (kInvalidArgument past the end), so a
  // reader can fill its own memory as it goes: a piece the range covers whole is loaded
  // straight into `out`, all such pieces of one call in one load; a piece covered in part is
  // loaded whole into temporary memory first (checked with `verify` either way). torch.load
  // reads each storage record in one call, which is exactly one piece: a file is never held
  // in memory twice.
  Status read_range(uint64_t offset, std::byte* out, size_t n, bool verify) const;
  // The whole file, in order, to `sink` in pieces of at most `chunk_bytes` (a positive multiple
  // of 4096): the other bytes as they are, each piece streamed from its tensor (decoded, and
  // checked with `verify` once it has been streamed): a few chunks of memory, whatever the
  // file's size. A non-OK status from the sink stops it and is returned.
  Status stream(uint64_t chunk_bytes, bool verify,
                const std::function<Status(const std::byte*, size_t)>& sink) const;
  const std::string& name() const { return name_; }

 private:
  SplitFileReader(CheckpointReader* reader, std::string name, std::string bytes, uint64_t size,
                  std::vector<SplitPiece> pieces, std::vector<size_t> piece_tensors,
                  size_t rest_offset);
  CheckpointReader* reader_;
  std::string name_;
  std::string bytes_;  // the skeleton file
  uint64_t size_;
  std::vector<SplitPiece> pieces_;
  std::vector<uint64_t> pieces_before_;  // per piece: the pieces' bytes before it
  std::vector<size_t> piece_tensors_;    // per piece: its tensor's index in the manifest
  size_t rest_offset_;                   // where the other bytes start in bytes_
};

// Writes `split` as the plain file <directory>/<split.name()> (new, through a FastFileWriter,
// fdatasynced when `durable`), streamed (SplitFileReader::stream, every piece checked), and
// returns its record: role "objects", its size, the XXH3-64 of the whole file (0 without
// `checksums`), `rank`. What `fastpersist convert` writes a split DeepSpeed tag back with. On
// failure no file is left.
Result<ManifestFile> write_plain_file(const SplitFileReader& split, const std::string& directory,
                                      bool durable, bool checksums, std::optional<uint32_t> rank);

// Whether bytes that a file starts with are a skeleton's (its format tag): a plain torch.save
// file starts otherwise ("PK", a zip archive).
bool is_split_skeleton(std::string_view head);

}  // namespace fastpersist
