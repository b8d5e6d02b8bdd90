// SPDX-License-Identifier: Apache-2.0
// Incremental checkpoints (docs/incremental.md): which tensors of a save equal those of its base
// checkpoint, and the manifest records that reference the base's bytes instead of writing them.
//
// A tensor is unchanged when its name, dtype and shape equal a base tensor's and the XXH3-128 of
// its raw bytes equals the base's recorded `xxh3_128`. Its record is then the base's record
// (encoding, offset, checksum...) with the file renamed "<base tag>/<file>", and that file's
// record joins the manifest's `files` under the same name, so readers (load, verify, export)
// check and read it where it lies. The base is a full checkpoint: chains are one step long.
//
// Thread-safety: pure functions; digest_tensors runs its own worker threads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fastpersist/checksum.h"
#include "fastpersist/manifest.h"
#include "fastpersist/tensor_source.h"

namespace fastpersist::checkpoint {

// XXH3-128 of each host tensor's bytes, on up to `threads` threads (0: one per core), tensors
// split among them. nullopt for a device tensor (its bytes are not hashed on the host: it is
// always written) and for an empty one.
std::vector<std::optional<ContentDigest>> digest_tensors(const std::vector<TensorSource>& tensors,
                                                         unsigned threads);

struct BaseMatch {
  // Per tensor of the save: the index of the equal tensor in the base manifest, or nullopt.
  std::vector<std::optional<size_t>> base_index;
  uint64_t referenced_bytes = 0;  // raw bytes of the unchanged tensors
  uint64_t changed_bytes = 0;     // raw bytes of the others
  // Whether the save should reference the base: something is unchanged and no more than half
  // of the bytes changed (beyond that a full checkpoint is worth its cost: it becomes the new
  // base, and later saves compare against fresher bytes).
  bool worth_it() const { return referenced_bytes > 0 && changed_bytes <= referenced_bytes; }
};

// Matches the save's tensors against `base` (a full checkpoint's manifest: a tensor that is
// itself a reference never matches, so chains cannot grow).
BaseMatch match_base(const std::vector<TensorSource>& tensors,
                     const std::vector<std::optional<ContentDigest>>& digests, const Manifest& base);

// The record of base tensor `base.tensors[index]` as this checkpoint stores it: a reference into
// `base_tag`'s file, named `name`.
ManifestTensor referenced_tensor(const Manifest& base, const std::string& base_tag, size_t index);

// The `files` records of the base files the tensors in `tensors` reference (names
// "<base_tag>/<file>"), each once, in the base's order.
std::vector<ManifestFile> referenced_files(const Manifest& base, const std::string& base_tag,
                                           const std::vector<ManifestTensor>& tensors);

}  // namespace fastpersist::checkpoint
