// SPDX-License-Identifier: Apache-2.0
// Draining committed checkpoints into tiers (tier.h; private to src/checkpoint): which
// checkpoints a tier should receive, one pass over a tier, and the background thread a
// CheckpointManager with tiers runs.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/tier_link.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/tier.h"
#include "tier/tier_copy.h"

namespace fastpersist::checkpoint {

// The tags of `local` (committed, oldest first) that a tier holding `tier` should receive now,
// oldest first: those `options.every` selects, newer than everything in the tier (what the
// tier's retention already removed is not sent again) and not there, less those the tier's
// retention would remove at once; plus the base of each incremental one the tier lacks, before
// it.
std::vector<std::string> plan_drain(const std::vector<CheckpointInfo>& local,
                                    const std::vector<CheckpointInfo>& tier,
                                    const TierOptions& options);

// Each tier valid (TierOptions::validate) and none of `root` and the tiers the same directory as
// another or inside another (kInvalidArgument naming both).
Status check_tiers(const std::string& root, const std::vector<TierOptions>& tiers);

// Opens the manager of a tier: its root lock (kBusy when another process holds it), its
// retention, and the debris of a drain that died removed. A drainer holds it for one pass. `base`
// gives the engine and durability.
Result<std::unique_ptr<CheckpointManager>> open_tier(const TierOptions& tier,
                                                     const CheckpointOptions& base);

// Where one pass copies to: a directory tier (its CheckpointManager, whose lock the pass holds)
// or an object tier (object_tier.h). Opened for a pass, closed after it.
class TierTarget {
 public:
  virtual ~TierTarget() = default;
  virtual const std::string& where() const = 0;  // the tier's path or URL
  // The committed checkpoints there, oldest first.
  virtual Result<std::vector<CheckpointInfo>> list() = 0;
  // Copies <local_root>/<tag> there (copy_checkpoint's contract, or ObjectTier::upload's).
  virtual Result<CopyResult> receive(const std::string& local_root, const std::string& tag,
                                     IoEngine& read_engine, const CopyPacer& pacer) = 0;
  // Ends the pass: a directory tier's lock is released; an object tier's retention runs.
  virtual Status close() = 0;
};

// A directory tier: open_tier. An object tier: its store opened, and what drains that died
// left removed (objects without a manifest, unfinished uploads).
Result<std::unique_ptr<TierTarget>> open_tier_target(const TierOptions& tier,
                                                     const CheckpointOptions& base);

// The committed checkpoints of a tier, oldest first, without opening it for a pass (no lock).
Result<std::vector<CheckpointInfo>> list_tier(const TierOptions& tier);

// What one pass over one tier did (drain_tier).
struct TierPass {
  std::vector<std::string> drained;  // oldest first
  std::vector<std::string> gone;     // planned, removed locally before their turn (not errors)
  std::vector<Status> failures;
  uint64_t bytes = 0;
  double seconds = 0;
};

// Hooks of a pass: when a copy starts and ends (the drainer's pins), and the pacing.
struct TierPassHooks {
  std::function<void(const std::string& tag)> begin;
  std::function<void(const std::string& tag, const Status& outcome)> end;
  CopyPacer pacer;
};

// Copies `plan` (plan_drain's, oldest first) from `local_root` into `tier`. A damaged local
// copy (kDataLoss) does not stop the others, except that a checkpoint whose base failed is not
// tried; any other failure ends the pass there, so that the tier never gets a newer checkpoint
// before an older one it selected (the retry sends them in order).
TierPass drain_tier(const std::string& local_root, const std::vector<std::string>& plan,
                    const std::vector<CheckpointInfo>& local, IoEngine& read_engine,
                    TierTarget& tier, const TierPassHooks& hooks);

// The background drainer of one CheckpointManager (thread-safe): the manager's TierLink.
class TierDrainer : public TierLink {
 public:
  using Setup = TierLinkSetup;
  static Result<std::unique_ptr<TierDrainer>> start(Setup setup);
  ~TierDrainer() override;  // stop()
  TierDrainer(const TierDrainer&) = delete;
  TierDrainer& operator=(const TierDrainer&) = delete;

  void committed(const std::string& tag) override;
  std::string pin_reason(const std::string& tag) const override;
  std::vector<Status> take_new_errors() override;
  Status wait(std::optional<double> timeout_seconds) override;
  // A copy in flight is cancelled (its temporary directory stays in the tier until the next
  // drainer removes it).
  void stop() override;
  std::vector<TierState> states() const override;
  std::vector<CheckpointPlace> locations(const std::vector<CheckpointInfo>& local,
                                         std::vector<std::string>* unreachable) override;
  Result<uint64_t> pull(const TierOptions& tier, const std::string& tag, IoEngine& read_engine,
                        CheckpointManager& destination) override;

 private:
  explicit TierDrainer(Setup setup);
  void run();
  void pass();

  struct Tier {
    TierOptions options;
    std::unique_ptr<TierTarget> target;   // the drain thread's, open during a pass
    std::vector<CheckpointInfo> listing;  // the drain thread's: as last seen
    TierState state;                      // under mu_
  };
  const Setup setup_;
  std::unique_ptr<IoEngine> read_engine_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Tier> tiers_;
  std::set<std::string> fresh_;  // committed since the current pass scanned the root
  std::vector<Status> new_errors_;
  size_t dropped_errors_ = 0;
  std::vector<Status> pass_failures_;  // of the last completed pass
  uint64_t requested_ = 0, started_ = 0, completed_ = 0;
  std::optional<std::chrono::steady_clock::time_point> retry_at_;
  double backoff_seconds_ = 1;
  bool stopping_ = false;
  std::atomic<bool> cancel_{false};
  std::thread thread_;
};

}  // namespace fastpersist::checkpoint

namespace fastpersist::checkpoint {

// The checkpoints of several roots merged (CheckpointManager::locations()): `roots[0]` is the
// local root; a root whose listing failed is skipped and named in `unreachable`.
std::vector<CheckpointPlace> merge_places(
    const std::vector<std::string>& roots,
    const std::vector<Result<std::vector<CheckpointInfo>>>& listings,
    std::vector<std::string>* unreachable);

// The checkpoints of `local_root` (listed as `local`) and of `tiers`, merged (merge_places).
std::vector<CheckpointPlace> locate_in_tiers(const std::string& local_root,
                                             const std::vector<CheckpointInfo>& local,
                                             const std::vector<TierOptions>& tiers,
                                             std::vector<std::string>* unreachable);
// Copies `tag` from the tier into `destination`, first the checkpoints it references that the
// destination lacks (CheckpointManager::pull()). Returns the bytes copied.
Result<uint64_t> copy_with_bases(const TierOptions& tier, const std::string& tag,
                                 IoEngine& read_engine, CheckpointManager& destination);

}  // namespace fastpersist::checkpoint
