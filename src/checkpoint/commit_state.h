// SPDX-License-Identifier: Apache-2.0
// The state behind a CheckpointCommit (private to src/checkpoint). The manager that began the
// commit is reached only through `manager`, a link it clears when it is destroyed, so a commit
// that outlives its manager fails cleanly instead of touching freed memory.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "fastpersist/checkpoint_commit.h"
#include "fastpersist/manifest.h"

namespace fastpersist {

// What a commit needs from its manager.
class CommitHost {
 public:
  virtual ~CommitHost() = default;
  // The next commit sequence; kInvalidArgument once the manager is closed.
  virtual Result<uint64_t> take_sequence() = 0;
  // Serializes `latest` updates with the manager's removals.
  virtual std::mutex& pointer_mutex() = 0;
  // `tag` committed with `manifest`: incremental bookkeeping, tiers, then retention.
  virtual Status after_commit(const std::string& tag,
                              const std::shared_ptr<const Manifest>& manifest) = 0;
  // `tag` is no longer being saved, and `base_tag` (when not empty) no longer its base.
  virtual void release_tag(const std::string& tag, const std::string& base_tag) = 0;
};

struct CommitLink {
  std::mutex mu;
  CommitHost* host = nullptr;  // null once the manager is gone
};

struct CheckpointCommit::State {
  std::string root;
  std::string tag;
  std::string directory;
  bool durable = true;
  std::string base_tag;  // incremental: the checkpoint the writers may reference ("" none)
  std::shared_ptr<CommitLink> manager;
  bool finished = false;
  Status retention;
};

}  // namespace fastpersist
