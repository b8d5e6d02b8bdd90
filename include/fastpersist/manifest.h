// SPDX-License-Identifier: Apache-2.0
// The manifest of a checkpoint directory (manifest.json): the one file a reader trusts. It is
// written last; a directory without a complete, well-formed manifest is not a checkpoint.
// It names every file with its size and every tensor with its dtype, shape, file, absolute byte
// offset, length and checksum, plus the run's metadata. Format: docs/format.md.
//
// Versions: encode_manifest writes format 2; decode_manifest reads 1 (what fastpersist 0.1
// wrote; its v2 fields take their defaults) and 2, and names the version of anything newer.
//
// Thread-safety: pure functions over plain values.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fastpersist/checksum.h"  // ContentDigest
#include "fastpersist/layout.h"    // kManifestFileName, the other on-disk names
#include "fastpersist/status.h"

namespace fastpersist {

// The version encode_manifest writes, and the oldest one decode_manifest still reads.
inline constexpr int kManifestFormatVersion = 2;
inline constexpr int kManifestOldestFormatVersion = 1;
inline constexpr std::string_view kManifestFormatName = "fastpersist-checkpoint";

// How a tensor's bytes are stored in its file (format v2 `encoding`): raw, a compressed
// encoding (tensor_codec.h: "zstd", "lz4"), or an XOR delta against the same tensor of the base
// checkpoint ("xor-zstd", with ManifestTensor::delta_base). A manifest may name any encoding of
// the form [a-z0-9_-]{1,64}; check_encoding_supported() is where readers refuse one they cannot
// decode.
inline constexpr std::string_view kEncodingRaw = "raw";

// v2, incremental checkpoints: the stored bytes of an "xor-zstd" tensor are zstd frames of the
// byte-grouped XOR of its raw bytes with those of the base's tensor, which lies here (docs/
// format.md, "XOR deltas"). The base's bytes are raw, "zstd" or "lz4" (never a delta: chains
// stay one step long) and hold exactly `length` raw bytes, whose checksum is `checksum`.
struct DeltaBase {
  std::string file;     // a `files` entry's name (a reference "<tag>/<name>" when saved)
  uint64_t offset = 0;  // absolute byte offset in that file
  uint64_t stored_length = 0;
  std::string encoding = std::string(kEncodingRaw);
  uint64_t checksum = 0;  // of the base's raw bytes
  bool operator==(const DeltaBase&) const = default;
};

struct ManifestTensor {
  std::string name;
  std::string dtype;  // safetensors dtype name
  std::vector<uint64_t> shape;
  std::string file;       // a `files` entry's name (see ManifestFile::name)
  uint64_t offset = 0;    // absolute byte offset in that file
  uint64_t length = 0;    // raw bytes: product(shape) * element size
  uint64_t checksum = 0;  // of the raw bytes (manifest checksum_algorithm)
  // v2: how the bytes at `offset` encode the raw bytes, and how many there are. For raw (and
  // for every v1 tensor) stored_length == length.
  std::string encoding = std::string(kEncodingRaw);
  uint64_t stored_length = 0;
  // v2, distributed checkpoints: this tensor is the block of a larger (global) tensor that
  // starts at `shard_offsets` (one entry per dimension). Both empty for a whole tensor.
  std::vector<uint64_t> global_shape;
  std::vector<uint64_t> shard_offsets;
  // v2, optional: XXH3-128 of the raw bytes, written by saves with incremental checkpoints on
  // (the hash an incremental save compares against its base's manifest). Absent: unknown.
  std::optional<ContentDigest> digest;
  // v2, "xor-zstd" tensors only (and required by them): the base bytes the delta applies to.
  std::optional<DeltaBase> delta_base;
};

struct ManifestFile {
  // The file's name inside the checkpoint directory (no '/'), or, v2, a reference into another
  // committed checkpoint of the same root: "<tag>/<name>" (a valid tag other than this
  // checkpoint's, then a plain name); incremental checkpoints point at their base's files
  // instead of writing them again. manifest_file_path() resolves both.
  std::string name;
  std::string role;  // "tensors" (safetensors) or "objects" (pickled sidecar)
  uint64_t size = 0;
  // tensors files: checksum of bytes [0, data_start) (length prefix + JSON header);
  // objects file: checksum of the whole file.
  uint64_t checksum = 0;
  uint64_t checksum_bytes = 0;  // how many leading bytes `checksum` covers
  // v2, distributed checkpoints: the rank that wrote the file (nullopt: a single process).
  std::optional<uint32_t> rank;
};

// The largest commit sequence a manifest may hold (a root commits once per save: far beyond
// any real count, and far enough below 2^64 that the next sequence never wraps).
inline constexpr uint64_t kMaxManifestSequence = uint64_t{1} << 62;

struct Manifest {
  // The version it was decoded from; encode_manifest always writes kManifestFormatVersion.
  int format_version = kManifestFormatVersion;
  std::string tag;
  std::optional<int64_t> step;
  uint64_t sequence = 0;    // commit order inside one root, 1, 2, 3, ...
  double created_unix = 0;  // wall time of the commit, seconds since the epoch
  std::string checksum_algorithm = "xxh3-64";
  std::map<std::string, std::string> versions;  // fastpersist, torch, python, ...
  std::string fingerprint;                      // xxh3 of the sorted "name:dtype:shape" lines, hex
  // The user's metadata: a JSON object (the caller checks that before encoding; anything else is
  // written as {}). Decoding gives back its compact dump, with the keys in their stored order.
  std::string metadata_json = "{}";
  std::map<std::string, std::string> aliases;  // name -> stored tensor it shares memory with
  // v2: how many ranks wrote the checkpoint (1: a single process; every v1 checkpoint).
  uint32_t world_size = 1;
  // v2, optional: how long the save blocked its caller, from save_async to the end of the
  // snapshot (seconds). `fastpersist advise --measure` reads it.
  std::optional<double> blocking_seconds;
  std::vector<ManifestFile> files;
  std::vector<ManifestTensor> tensors;

  uint64_t tensor_bytes() const;
  // Linear scans, for one lookup. Code that looks names up in a loop builds a ManifestIndex
  // (manifest_index.h) once instead, so that 10^5 tensors stay linear.
  std::optional<size_t> find_tensor(std::string_view name) const;
  const ManifestFile* find_file(std::string_view name) const;
};

// The model fingerprint over (name, dtype, shape) of `tensors`, order-independent.
std::string manifest_fingerprint(const std::vector<ManifestTensor>& tensors);
// The content hash of a checkpoint's tensors: 16 hex digits, the XXH3-64 of the sorted
// "name:dtype:global shape:block offsets:raw checksum" lines of every stored block. Equal for
// two checkpoints that hold the same tensor values whatever their files, encoding or write
// order; empty when the manifest records no checksums (kNoChecksum).
std::string manifest_content_hash(const Manifest& manifest);

// What the user's metadata must be before it is written: a JSON object, valid UTF-8, no key
// twice in one object, nested at most 255 levels (readers refuse a manifest nested deeper than
// 256, which would otherwise overflow the stack of whatever walks it, and the metadata sits one
// level inside it). kInvalidArgument says why not.
Status check_metadata_json(std::string_view json);

// JSON with one top-level field, file or tensor per line, ending in a newline.
std::string encode_manifest(const Manifest& manifest);

// Parses and checks a manifest (format 1 or 2): known format and version, every field present
// with the right type, file names plain or well-formed references, tensor files listed in
// `files`, offset + stored length within the file, lengths agreeing with dtype and shape, shard
// blocks inside their global shape, ranks below world_size, no duplicate names, aliases
// pointing at stored tensors. Linear in the size of the manifest. kDataLoss names the field
// that is wrong (`path` for messages); a version above kManifestFormatVersion is kDataLoss
// saying it was written by a newer fastpersist. docs/format.md lists every check.
Result<Manifest> decode_manifest(std::string_view json, const std::string& path);

// Where `file` of the checkpoint directory `checkpoint_dir` lies: <checkpoint_dir>/<name>, or
// for a reference "<tag>/<name>", <parent of checkpoint_dir>/<tag>/<name>. The name must have
// passed decode_manifest's checks, so the path stays inside the root as far as names go; the
// checkpoint layer also refuses symbolic links on a reference's way
// (checkpoint::resolve_manifest_file).
std::string manifest_file_path(const std::string& checkpoint_dir, const ManifestFile& file);
// The tag a reference points into ("" for a file of the checkpoint itself).
std::string_view referenced_checkpoint(const ManifestFile& file);

// The syntax of a checkpoint tag, shared by the manager (validate_tag) and the manifest's file
// references: 1-200 characters of [A-Za-z0-9._-], not starting with '.' (the manager's own
// names: .tmp-*, .trash-*, .lock) and not "latest". kInvalidArgument says why not.
Status check_tag_syntax(std::string_view tag);

// Whether this fastpersist can turn `tensor`'s stored bytes into its raw bytes. Every reader
// (load, verify) calls this before it reads a tensor: a manifest may name an encoding that a
// newer fastpersist wrote. kUnavailable: "tensor 'x': encoding "delta" is not supported by
// this fastpersist (it reads: raw, zstd, lz4)".
Status check_encoding_supported(const ManifestTensor& tensor);

// The largest manifest a reader accepts: about 14 million tensor blocks (4,096 ranks of
// FSDP-sharded 7B-parameter state take about 1.1 GB, docs/scale.md); a larger file is damage.
inline constexpr uint64_t kMaxManifestBytes = uint64_t{4} << 30;

// Reads `<dir>/manifest.json` and decodes it (kNotFound when absent). The file must be a
// regular file, not a symbolic link, FIFO or device (kDataLoss), of at most kMaxManifestBytes.
Result<Manifest> read_manifest(const std::string& dir);

}  // namespace fastpersist
