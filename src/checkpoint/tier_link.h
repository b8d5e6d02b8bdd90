// SPDX-License-Identifier: Apache-2.0
// What a CheckpointManager asks of its tiers (tier.h), as an interface (private to the library).
//
// The tier layer (src/tier/) builds on this one: a directory tier is a CheckpointManager, and
// copies commit through CheckpointCommit. The manager in turn must tell its tiers about each
// commit, respect their pins and report their state. So that the core never calls tier code,
// the tier layer implements TierLink and hands one to each manager it opens:
// CheckpointManager::open is defined there (src/tier/manager_open.cc), and calls open_manager
// below with a factory. A manager opened without tiers has no link.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fastpersist/checkpoint.h"
#include "fastpersist/io_engine.h"
#include "fastpersist/status.h"
#include "fastpersist/tier.h"

namespace fastpersist::checkpoint {

class TierLink {
 public:
  virtual ~TierLink() = default;

  // A checkpoint was committed locally: pinned (when pin_until_drained) and a pass is due.
  virtual void committed(const std::string& tag) = 0;
  // Why local retention must leave `tag` alone now ("" when it need not).
  virtual std::string pin_reason(const std::string& tag) const = 0;
  // Failures since the last call (at most 32; a note says how many more).
  virtual std::vector<Status> take_new_errors() = 0;
  // A pass that starts after this call has ended: OK when it left nothing undrained, else its
  // failures; kBusy when `timeout_seconds` passed first.
  virtual Status wait(std::optional<double> timeout_seconds) = 0;
  // Stops draining; a copy in flight is cancelled. Idempotent.
  virtual void stop() = 0;
  virtual std::vector<TierState> states() const = 0;
  // Where the checkpoints of the local root (listed as `local`) and of each tier live
  // (CheckpointManager::locations()).
  virtual std::vector<CheckpointPlace> locations(const std::vector<CheckpointInfo>& local,
                                                 std::vector<std::string>* unreachable) = 0;
  // Copies `tag` from `tier` into `destination`, its bases first (CheckpointManager::pull()).
  virtual Result<uint64_t> pull(const TierOptions& tier, const std::string& tag,
                                IoEngine& read_engine, CheckpointManager& destination) = 0;
};

// What a manager gives its tiers when it opens.
struct TierLinkSetup {
  std::string local_root;
  std::vector<TierOptions> tiers;
  CheckpointOptions base;  // engine and durability of the tiers' managers
  bool pin_until_drained = true;
  std::function<Status()> after_drain;  // local retention, once pins were released
  // True while a local save is taking its snapshot (its caller is blocked): copying pauses
  // between pieces, so the drain does not lengthen what save_async blocks.
  std::function<bool()> pause;
};

using TierLinkFactory = std::function<Result<std::unique_ptr<TierLink>>(TierLinkSetup)>;

// CheckpointManager::open's work, less the checks of the tiers: creates and locks `root`, and
// when `options.tiers` is not empty, makes the manager's link with `make_link`.
Result<std::unique_ptr<CheckpointManager>> open_manager(const std::string& root,
                                                        const CheckpointOptions& options,
                                                        const TierLinkFactory& make_link);

}  // namespace fastpersist::checkpoint
