// SPDX-License-Identifier: Apache-2.0
// CheckpointManager::open: the tiers checked, then the core's open_manager with the drainer as
// the manager's TierLink (checkpoint/tier_link.h says why it is defined in the tier layer).
#include "checkpoint/tier_link.h"
#include "fastpersist/checkpoint.h"
#include "tier/tier_drain.h"

namespace fastpersist {

Result<std::unique_ptr<CheckpointManager>> CheckpointManager::open(
    const std::string& root, const CheckpointOptions& options) {
  if (root.empty()) return Status(StatusCode::kInvalidArgument, "checkpoint root is empty");
  FP_RETURN_IF_ERROR(options.validate());
  FP_RETURN_IF_ERROR(checkpoint::check_tiers(root, options.tiers));
  return checkpoint::open_manager(
      root, options,
      [](checkpoint::TierLinkSetup setup) -> Result<std::unique_ptr<checkpoint::TierLink>> {
        FP_ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::TierDrainer> drainer,
                            checkpoint::TierDrainer::start(std::move(setup)));
        return std::unique_ptr<checkpoint::TierLink>(std::move(drainer));
      });
}

}  // namespace fastpersist
