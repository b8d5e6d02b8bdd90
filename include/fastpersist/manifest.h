// SPDX-License-Identifier: Apache-2.0
// The manifest of a checkpoint directory (manifest.json): the one file a reader trusts. It is
// written last; a directory without a complete, well-formed manifest is not a checkpoint.
// It names every file with its size and every tensor with its dtype, shape, file, absolute byte
// offset, length and checksum, plus the run's metadata. Format: docs/format.md.
//
// Thread-safety: pure functions over plain values.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fastpersist/layout.h"  // kManifestFileName, the other on-disk names
#include "fastpersist/status.h"

namespace fastpersist {

inline constexpr int kManifestFormatVersion = 1;
inline constexpr std::string_view kManifestFormatName = "fastpersist-checkpoint";

// How a tensor's bytes are stored in its file (format v2 `encoding`). Only raw exists today;
// codecs (compression, deltas) add names here, and readers refuse a name they do not know.
inline constexpr std::string_view kEncodingRaw = "raw";

struct ManifestTensor {
  std::string name;
  std::string dtype;            // safetensors dtype name
  std::vector<uint64_t> shape;
  std::string file;             // a `files` entry's name (see ManifestFile::name)
  uint64_t offset = 0;          // absolute byte offset in that file
  uint64_t length = 0;          // raw bytes: product(shape) * element size
  uint64_t checksum = 0;        // of the raw bytes (manifest checksum_algorithm)
  // v2: how the bytes at `offset` encode the raw bytes, and how many there are. For raw (and
  // for every v1 tensor) stored_length == length.
  std::string encoding = std::string(kEncodingRaw);
  uint64_t stored_length = 0;
  // v2, distributed checkpoints: this tensor is the block of a larger (global) tensor that
  // starts at `shard_offsets` (one entry per dimension). Both empty for a whole tensor.
  std::vector<uint64_t> global_shape;
  std::vector<uint64_t> shard_offsets;
};

struct ManifestFile {
  // The file's name inside the checkpoint directory (no '/'), or, v2, a reference into another
  // committed checkpoint of the same root: "<tag>/<name>" (a valid tag other than this
  // checkpoint's, then a plain name); incremental checkpoints point at their base's files
  // instead of writing them again. manifest_file_path() resolves both.
  std::string name;
  std::string role;             // "tensors" (safetensors) or "objects" (pickled sidecar)
  uint64_t size = 0;
  // tensors files: checksum of bytes [0, data_start) (length prefix + JSON header);
  // objects file: checksum of the whole file.
  uint64_t checksum = 0;
  uint64_t checksum_bytes = 0;  // how many leading bytes `checksum` covers
  // v2, distributed checkpoints: the rank that wrote the file (nullopt: a single process).
  std::optional<uint32_t> rank;
};

struct Manifest {
  int format_version = kManifestFormatVersion;
  std::string tag;
  std::optional<int64_t> step;
  uint64_t sequence = 0;           // commit order inside one root, 1, 2, 3, ...
  double created_unix = 0;         // wall time of the commit, seconds since the epoch
  std::string checksum_algorithm = "xxh3-64";
  std::map<std::string, std::string> versions;  // fastpersist, torch, python, ...
  std::string fingerprint;         // xxh3 of the sorted "name:dtype:shape" lines, hex
  // The user's metadata: a JSON object (the caller checks that before encoding; anything else is
  // written as {}). Decoding gives back its compact dump, with the keys in their stored order.
  std::string metadata_json = "{}";
  std::map<std::string, std::string> aliases;   // name -> stored tensor it shares memory with
  // v2: how many ranks wrote the checkpoint (1: a single process; every v1 checkpoint).
  uint32_t world_size = 1;
  std::vector<ManifestFile> files;
  std::vector<ManifestTensor> tensors;

  uint64_t tensor_bytes() const;
  std::optional<size_t> find_tensor(std::string_view name) const;
  const ManifestFile* find_file(std::string_view name) const;
};

// The model fingerprint over (name, dtype, shape) of `tensors`, order-independent.
std::string manifest_fingerprint(const std::vector<ManifestTensor>& tensors);

// JSON with one top-level field, file or tensor per line, ending in a newline.
std::string encode_manifest(const Manifest& manifest);

// Parses and checks a manifest: known format and version, every field present with the right
// type, tensor files listed in `files`, offset + length within the file, no duplicate names,
// aliases pointing at stored tensors. kDataLoss names what is wrong (`path` for messages).
Result<Manifest> decode_manifest(std::string_view json, const std::string& path);

// Where `file` of the checkpoint directory `checkpoint_dir` lies: <checkpoint_dir>/<name>, or
// for a reference "<tag>/<name>", <parent of checkpoint_dir>/<tag>/<name>. The name must have
// passed decode_manifest's checks (it never leaves the root).
std::string manifest_file_path(const std::string& checkpoint_dir, const ManifestFile& file);
// The tag a reference points into ("" for a file of the checkpoint itself).
std::string_view referenced_checkpoint(const ManifestFile& file);

// Reads `<dir>/manifest.json` and decodes it (kNotFound when absent).
Result<Manifest> read_manifest(const std::string& dir);

}  // namespace fastpersist
