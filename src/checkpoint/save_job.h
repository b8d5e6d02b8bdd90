// SPDX-License-Identifier: Apache-2.0
// One save, start to commit. The steps, in this order (docs/commit_protocol.md):
//
//   1. mkdir <root>/.tmp-<tag>-<unique>/
//   2. the data files, by the manager's ShardWriter (the one write path, shard_writer.h): in
//      parallel, created, preallocated, staged window by window into pinned memory with each
//      tensor's checksum computed on the staged bytes, written with O_DIRECT, fdatasynced. The
//      snapshot is over when every source byte is staged.
//   3. objects.pkl, written and fdatasynced; then manifest.json (every file with its size and
//      checksum, every tensor with its offset, length and checksum), written and fdatasynced;
//      then the directory is fsynced.
//   4. rename(<root>/.tmp-..., <root>/<tag>) (never replacing an existing tag); fsync <root>.
//   5. <root>/latest replaced atomically (write temp, fsync, rename, fsync <root>).
// Until the rename in step 4 nothing under a tag name exists, so a crash leaves the old state;
// after it the checkpoint is complete and durable. On failure the temporary directory is
// removed.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "checkpoint/pending_save.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/layout.h"
#include "fastpersist/shard_writer.h"

namespace fastpersist::checkpoint {

struct SaveJob {
  std::string root;
  std::string tag;
  CheckpointContent content;
  ShardPlan plan;  // from plan_content, made once when the save is queued
  uint64_t sequence = 0;
  std::shared_ptr<PendingSave::State> state;
  // Held from the rename into place (4) through the pointer update (5), so a removal that
  // repoints `latest` meanwhile never points it back past this commit. May be null.
  std::mutex* pointer_mu = nullptr;
  // Incremental checkpoints (incremental.h): with a base, the tensors equal to the base's are
  // stored as references to its files (the writer records every digest: content_digests).
  std::string base_tag;
  std::shared_ptr<const Manifest> base;
  bool base_trusted = false;  // committed by this process (incremental.h, IncrementalBase)
};

// What save_async does before queueing: checks the metadata, the tensor descriptions, names
// and aliases (kInvalidArgument), and plans the data files.
Result<ShardPlan> plan_content(const CheckpointContent& content, const ShardWriter& writer);

// Runs every step; marks the snapshot done as soon as it is; returns the outcome, the bytes
// written and the manifest committed (it does not call state->finish). With a base, the digests
// are computed first (on the save's thread and helpers: the caller is not blocked) and the
// tensors that changed are planned again; when more than half of the bytes changed the save is
// full after all. state->base_tag says which it was.
Status run_save_job(const SaveJob& job, const CheckpointOptions& options, ShardWriter& writer,
                    uint64_t* bytes_written, std::shared_ptr<const Manifest>* committed = nullptr);

}  // namespace fastpersist::checkpoint
