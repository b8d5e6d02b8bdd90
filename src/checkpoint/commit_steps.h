// SPDX-License-Identifier: Apache-2.0
// Steps 3b-5 of the commit protocol (save_job.h), shared by the manager's own saves and by
// CheckpointCommit (checkpoint_commit.h): once every other file of a temporary checkpoint
// directory is written and synced, write its manifest, make it durable, rename it into place
// and point `latest` at it. Private to src/checkpoint.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "fastpersist/manifest.h"
#include "fastpersist/status.h"

namespace fastpersist::checkpoint {

struct CommitTarget {
  std::string root;
  std::string tag;
  std::string temp_dir;  // <root>/.tmp-<tag>-<unique>, holding every file but the manifest
  bool durable = true;
  // Held from the rename through the pointer update, so a removal that repoints `latest`
  // meanwhile never points it back past this commit. May be null.
  std::mutex* pointer_mu = nullptr;
};

// manifest.json written (O_EXCL) and synced, the directory fsynced; rename to <root>/<tag>
// (kAlreadyExists when the tag exists), root fsynced; `latest` replaced. If the pointer cannot
// be written the rename is undone: an error always means that nothing was committed (unless
// the undo itself failed, which the message says). `*manifest_bytes` = the manifest's size.
// The caller removes temp_dir on failure (it may be gone after a failed pointer update).
Status commit_temp_directory(const CommitTarget& target, const Manifest& manifest,
                             uint64_t* manifest_bytes);

// Seconds since the epoch, for Manifest::created_unix.
double unix_now();

}  // namespace fastpersist::checkpoint
