// SPDX-License-Identifier: Apache-2.0
// Which committed checkpoints a retention policy removes. Pure: the caller does the removal.
//
// keep_last N keeps the newest N; keep_every K also keeps every checkpoint whose step is a
// multiple of K (milestones). The newest checkpoint is always kept, whatever the policy; with
// neither rule nothing is removed.
//
// Damaged checkpoints (root_scan.h) do not count towards N. One goes when the policy would have
// removed it had it been intact: N valid checkpoints are newer than it (by the commit sequence
// its manifest records) and it is not a milestone. Nothing can load it, and it may hold
// gigabytes. A damaged checkpoint with fewer than N valid ones after it stays for the user to
// look at, and one whose manifest does not decode (its age is unknown) is never removed by
// retention (`remove(tag)` does it).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/root_scan.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/io_engine.h"

namespace fastpersist::checkpoint {

// `committed` is oldest to newest (as list_checkpoints returns). Returns the tags to remove.
std::vector<std::string> select_for_removal(const std::vector<CheckpointInfo>& committed,
                                            std::optional<unsigned> keep_last,
                                            std::optional<int64_t> keep_every);

// The damaged checkpoints the same policy removes (see above).
std::vector<std::string> select_damaged_for_removal(const RootScan& scan,
                                                    std::optional<unsigned> keep_last,
                                                    std::optional<int64_t> keep_every);

// For a verified prune: checks committed checkpoints newest first with `check` ("" when
// intact, else the problem) until `keep_last` of them are intact (at least one is looked for).
// Each one that is not moves from scan->committed to scan->damaged: it no longer counts towards
// keep_last, so an older intact checkpoint is kept in its place, and it is removed only as
// damaged checkpoints are (never when it is the newest). Older checkpoints are not read.
// Returns "tag: problem" for each one moved.
std::vector<std::string> demote_damaged(
    RootScan* scan, unsigned keep_last,
    const std::function<std::string(const CheckpointInfo&)>& check);
// The same, checking each checkpoint of `root` with verify_checkpoint (every checksum).
std::vector<std::string> demote_damaged(RootScan* scan, unsigned keep_last, const std::string& root,
                                        IoEngine& engine);

// What a policy does to a root, and why each committed checkpoint stays.
struct RetentionDecision {
  // Committed tags (oldest first), then damaged ones, except that a checkpoint comes after
  // every checkpoint in the list that references it (an incremental one before its base).
  std::vector<std::string> remove;
  // Each committed checkpoint kept, oldest first, with why: "the newest", "one of the newest
  // N", "a milestone (...)", "the base of X, Y (incremental, kept)" (several joined by "; ").
  std::vector<std::pair<std::string, std::string>> kept;
};

// The policy (select_for_removal, select_damaged_for_removal), except that a checkpoint another
// kept one references (an incremental checkpoint's base) is kept with it.
RetentionDecision decide_retention(const RootScan& scan, std::optional<unsigned> keep_last,
                                   std::optional<int64_t> keep_every);

// Everything the policy removes from a root: decide_retention(...).remove.
std::vector<std::string> select_all_for_removal(const RootScan& scan,
                                                std::optional<unsigned> keep_last,
                                                std::optional<int64_t> keep_every);

}  // namespace fastpersist::checkpoint
