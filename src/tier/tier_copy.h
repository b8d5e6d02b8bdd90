// SPDX-License-Identifier: Apache-2.0
// Copies one committed checkpoint from a root into another root's manager (private to
// src/checkpoint): a tier's drain, and pulling a tier's checkpoint back to local storage.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_commit.h"
#include "fastpersist/io_engine.h"
#include "fastpersist/status.h"

namespace fastpersist::checkpoint {

// Called before each piece is read with the bytes copied so far (all files of the checkpoint):
// an error stops the copy (cancellation); it may sleep (a bandwidth cap, a pause).
using CopyPacer = std::function<Status(uint64_t copied_bytes)>;

// A pacer that keeps one copy at most `bytes_per_second` (0: no cap; its clock starts at the
// first piece of each checkpoint), waits while `pause()` is true (optional), and stops it with
// kBusy once `*cancel` is set (optional).
CopyPacer make_pacer(uint64_t bytes_per_second, const std::atomic<bool>* cancel = nullptr,
                     std::function<bool()> pause = {});

// What committing a copy of the checkpoint `m` records: its step, metadata, files, tensors,
// aliases and creation time (the committing library's version is written anew).
CommitContent content_of(Manifest m);

struct CopyResult {
  bool copied = false;  // false: `destination` already had the tag (nothing was done)
  uint64_t bytes = 0;   // bytes of the files copied
};

// Copies <source_root>/<tag> into `destination` under the same tag. Every own file of the
// checkpoint is read once through `read_engine` (direct reads) and checked against the
// manifest as it streams (sizes, headers, every checksum) while it is written into the
// destination's temporary directory (begin_commit); then the destination commits it with the
// original's step, metadata, tensors, files and creation time (CheckpointCommit). Files the
// checkpoint references in its base ("<base>/<file>", incremental checkpoints) are not copied:
// the destination must hold the base already (kDataLoss from the commit otherwise).
// Errors: kNotFound when the source has no such checkpoint (removed meanwhile); kDataLoss when
// the source copy is damaged (naming the first problem); the destination's errors; the pacer's.
// On any failure the destination is left as it was.
Result<CopyResult> copy_checkpoint(const std::string& source_root, const std::string& tag,
                                   IoEngine& read_engine, CheckpointManager& destination,
                                   const CopyPacer& pacer = {});

}  // namespace fastpersist::checkpoint
