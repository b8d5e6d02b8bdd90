// SPDX-License-Identifier: Apache-2.0
// Looking after checkpoint roots, as library calls: what `fastpersist list`, `verify`, `prune`
// and `drain` do, for a root directory or a root in an object store ("s3://bucket/run1",
// docs/tiers.md). The CLI is built on these and on CheckpointManager, never on the library's
// private headers.
//
// A directory's checkpoints change only through a CheckpointManager, which holds the root's lock
// (a real prune is CheckpointManager::prune); the calls here read a directory and plan. An object
// store has no lock (one drainer per tier, docs/tiers.md): ObjectStoreRoot::prune removes there
// directly, each checkpoint's manifest first.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/io_engine.h"
#include "fastpersist/manifest.h"
#include "fastpersist/options.h"
#include "fastpersist/status.h"
#include "fastpersist/tier.h"

namespace fastpersist {

// A directory (or object prefix) with a valid tag name and a manifest.json whose checks fail: the
// manifest does not decode, or a file it names is missing or has the wrong size. When the
// manifest decodes, its commit sequence and step are known: retention needs them to tell whether
// it is older than every checkpoint it keeps, and a manager never hands out a sequence number a
// damaged checkpoint already carries.
struct DamagedCheckpoint {
  std::string tag;
  std::string reason;
  std::optional<uint64_t> sequence;  // from its manifest, when the manifest decodes
  std::optional<int64_t> step;
  std::vector<std::string> references = {};  // from its manifest (CheckpointInfo's)
};

// One pass over a root: the committed checkpoints (what list_checkpoints returns) and the
// damaged ones.
struct RootScan {
  std::vector<CheckpointInfo> committed;   // oldest to newest: sequence, then tag
  std::vector<DamagedCheckpoint> damaged;  // in name order
  // The highest commit sequence any manifest under the root records (0: none).
  uint64_t highest_sequence() const;
};

// A root directory.
Result<RootScan> scan_root(const std::string& root);
// A root directory or an object store's URL (ObjectStoreRoot::scan).
Result<RootScan> scan_any_root(const std::string& root);

// The checkpoints whose files `manifest` references (an incremental checkpoint's bases), in name
// order, each once.
std::vector<std::string> referenced_checkpoints(const Manifest& manifest);

// A retention policy (CheckpointOptions' keep_last and keep_every): the newest `keep_last`
// checkpoints stay, and every one whose step is a multiple of `keep_every`; the newest always
// stays, and so does a base that a kept incremental checkpoint references.
struct RetentionPolicy {
  std::optional<unsigned> keep_last;
  std::optional<int64_t> keep_every;
};

// What a prune removes and keeps.
struct PrunePlan {
  std::vector<std::string> remove;  // in removal order (an incremental one before its base)
  std::vector<std::string> kept;    // committed, oldest first
  // Why each kept checkpoint stays, oldest first: "the newest", "one of the newest N", "a
  // milestone (...)", "the base of X (incremental, kept)". Not for one a check demoted.
  std::vector<std::pair<std::string, std::string>> kept_because;
  // With verification: "tag: problem" for each checkpoint that failed it. It no longer counts
  // towards keep_last (so an older intact one stays) and goes only as damaged checkpoints do.
  std::vector<std::string> damaged;
};

// What CheckpointManager::prune would do to the root directory `root` now; changes nothing and
// takes no lock. With `verify_engine`, the checkpoints it would keep are read newest first (every
// checksum) until `policy.keep_last` of them are intact.
Result<PrunePlan> plan_prune(const std::string& root, const RetentionPolicy& policy,
                             IoEngine* verify_engine = nullptr);

// A checkpoint root in an object store: the same listing, verification and retention as for a
// root directory. The store comes from open_object_store (object_store.h).
class ObjectStoreRoot {
 public:
  // The root at `url` ("s3://bucket/prefix"), with the default transfer settings.
  static Result<std::unique_ptr<ObjectStoreRoot>> open(const std::string& url);
  ~ObjectStoreRoot();
  ObjectStoreRoot(const ObjectStoreRoot&) = delete;
  ObjectStoreRoot& operator=(const ObjectStoreRoot&) = delete;

  const std::string& url() const;
  // Committed checkpoints are those whose manifest is there; objects without one (a drain in
  // progress, or one that died) are not listed.
  Result<RootScan> scan();
  // Checks TAG as `fastpersist verify` checks a local checkpoint: its files and those it
  // references are fetched into a private folder under $TMPDIR (else /tmp; removed afterwards),
  // then verify_checkpoint runs there. kNotFound when TAG is not committed there.
  Result<VerifyReport> verify(const std::string& tag, IoEngine& engine);
  // Applies `policy` (plan_prune's rules); with `dry_run` removes nothing. Each removal deletes
  // the checkpoint's manifest first, so it stops being listed before any of its files goes.
  Result<PrunePlan> prune(const RetentionPolicy& policy, bool dry_run,
                          IoEngine* verify_engine = nullptr);

 private:
  struct Impl;
  explicit ObjectStoreRoot(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Draining a root into a tier now (`fastpersist drain`; the background drainer of a manager with
// tiers does the same, tier.h).
struct DrainReport {
  std::vector<std::string> planned;  // what the tier lacked and its policy selects, oldest first
  std::vector<std::string> drained;  // copied, oldest first
  std::vector<std::string> gone;     // planned, removed locally before their turn (no error)
  std::vector<Status> failures;
  uint64_t bytes = 0;
  double seconds = 0;
};

// Each tier valid (TierOptions::validate), and none of `root` and the tiers the same directory as
// another or inside another: kInvalidArgument naming both (what CheckpointManager::open checks).
Status validate_tiers(const std::string& root, const std::vector<TierOptions>& tiers);

// The checkpoints of the root directory `root` that a drain into `tier` would copy, oldest
// first; changes nothing and takes no lock. kInvalidArgument for a tier that is invalid
// (TierOptions::validate), overlaps the root, or is a path of another kind than a root (a
// missing one is fine: the drain creates it).
Result<std::vector<std::string>> plan_drain_into(const std::string& root, const TierOptions& tier);

// Copies what plan_drain_into names from `root` into `tier`, verified on the way, then applies
// the tier's retention. A directory tier is locked for the pass (kBusy names the holder).
// `on_begin(tag)` runs as each copy starts. Errors: those of plan_drain_into and of opening the
// tier; failures of single copies are in the report.
Result<DrainReport> drain_into(const std::string& root, const TierOptions& tier,
                               const EngineOptions& engine,
                               const std::function<void(const std::string& tag)>& on_begin = {});

// Where the checkpoints of `root` (listed as `local`) and of the tiers at `tier_paths` live (as
// CheckpointManager::locations()): a tier whose listing fails is skipped and named in
// `unreachable`.
std::vector<CheckpointPlace> locate_checkpoints(const std::string& root,
                                                const std::vector<CheckpointInfo>& local,
                                                const std::vector<std::string>& tier_paths,
                                                std::vector<std::string>* unreachable);

}  // namespace fastpersist
