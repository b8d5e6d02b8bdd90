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
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fastpersist/checksum.h"
#include "fastpersist/manifest.h"
#include "fastpersist/shard_writer.h"
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
  // With XOR deltas, per changed tensor: the index of its previous version in the base (same
  // name, float dtype, shape, at least kMinEncodedTensorBytes), which a delta can be taken
  // against; nullopt otherwise (and always without XOR deltas).
  std::vector<std::optional<size_t>> delta_index;
  uint64_t referenced_bytes = 0;  // raw bytes of the unchanged tensors
  uint64_t changed_bytes = 0;     // raw bytes of the others
  uint64_t delta_bytes = 0;       // raw bytes of the changed tensors with a delta_index
  // Whether the save should reference the base: something can be taken from it (a tensor
  // unchanged, or one to take a delta against) and the bytes with nothing in the base are no
  // more than those (beyond that a full checkpoint is worth its cost: it becomes the new base,
  // and later saves compare against fresher bytes). Without XOR deltas: something is unchanged
  // and no more than half of the bytes changed.
  bool worth_it() const {
    const uint64_t from_base = referenced_bytes + delta_bytes;
    return from_base > 0 && changed_bytes - delta_bytes <= from_base;
  }
};

// Matches the save's tensors against `base` (a full checkpoint's manifest: a tensor that is
// itself a reference never matches, so chains cannot grow); with `xor_deltas`, also finds the
// base of each changed tensor a delta can be taken against.
BaseMatch match_base(const std::vector<TensorSource>& tensors,
                     const std::vector<std::optional<ContentDigest>>& digests, const Manifest& base,
                     bool xor_deltas = false);

// The XOR delta source of changed tensor `i` (match.delta_index[i] set): the base's bytes as
// this checkpoint's manifest names them ("<base_tag>/<file>"), at `base_dir` (the base
// checkpoint's directory; its file is resolved there, refusing symbolic links).
Result<DeltaSource> delta_source(const Manifest& base, const std::string& base_tag,
                                 const std::string& base_dir, size_t index);

// The record of base tensor `base.tensors[index]` as this checkpoint stores it: a reference into
// `base_tag`'s file, named `name`.
ManifestTensor referenced_tensor(const Manifest& base, const std::string& base_tag, size_t index);

// The stored bytes of the tensors `m` holds in its own files (not its references).
uint64_t own_stored_bytes(const Manifest& m);

// The `files` records of the base files the tensors in `tensors` reference (names
// "<base_tag>/<file>"), each once, in the base's order.
std::vector<ManifestFile> referenced_files(const Manifest& base, const std::string& base_tag,
                                           const std::vector<ManifestTensor>& tensors);

// A committed full checkpoint that a save compares against and may reference.
struct IncrementalBase {
  std::string tag;
  std::string dir;  // its directory
  std::shared_ptr<const Manifest> manifest;
  // Committed by this process: its records describe the bytes this process wrote. Otherwise
  // (read from disk: a manager that opened a root, a rank of a distributed save) the records are
  // untrusted, and each tensor is checked before a save first references it (below).
  bool trusted = false;
};

// Of base tensors `indices` (into base.manifest->tensors), which hold the bytes their records
// describe: each one's raw bytes are read (decoded) and must match both its XXH3-64 checksum and
// its XXH3-128 digest. A manifest edited so that a digest names other bytes would otherwise make
// a save reference the wrong bytes, which a load would return as the tensor. Results are kept
// for the life of the process per base (directory, sequence and fingerprint), so a tensor is
// read once however many saves reference it. A base whose manifest on disk is no longer
// `base.manifest` fails every tensor.
std::vector<bool> check_base_tensors(const IncrementalBase& base,
                                     const std::vector<size_t>& indices,
                                     std::shared_ptr<IoEngine> engine);

// What write_tensors wrote.
struct TensorWrite {
  // Records in the order of the tensors (each with its XXH3-128 where one was computed), then
  // the records of the base files that references point into.
  ShardWriteResult data;
  bool references_base = false;   // some tensor is a reference into (or a delta against) the base
  uint64_t referenced_bytes = 0;  // raw bytes of the unchanged tensors (0 for a full write)
};

// Step 2 of a save, full or incremental. Without `base`, writes every tensor (following
// `full_plan` when given, made by writer.plan from the same list). With `base`, hashes the
// tensors first (on `threads` threads, 0: one per core), matches them against it and, when
// BaseMatch::worth_it, writes only the changed ones and records the others as references (with
// `xor_deltas`, a changed float tensor may become a delta against its previous version);
// otherwise it writes them all after all. The source memory must stay unchanged until
// callbacks.on_snapshot_done.
Result<TensorWrite> write_tensors(ShardWriter& writer, const std::string& directory,
                                  const std::vector<TensorSource>& tensors,
                                  const ShardPlan* full_plan, const IncrementalBase* base,
                                  bool xor_deltas, unsigned threads,
                                  const ShardWriteCallbacks& callbacks = {});

}  // namespace fastpersist::checkpoint
