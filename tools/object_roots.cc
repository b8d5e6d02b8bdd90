// SPDX-License-Identifier: Apache-2.0
#include "object_roots.h"

#include <cstdlib>
#include <utility>

#include "checkpoint/tier_drain.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/object_store.h"
#include "fastpersist/tier.h"

namespace fastpersist::cli {

Result<std::unique_ptr<checkpoint::ObjectTier>> open_object_root(const std::string& url) {
  TierOptions tier;
  tier.path = url;
  return checkpoint::open_object_tier(tier);
}

Result<std::vector<CheckpointInfo>> list_any_root(const std::string& root,
                                                  std::vector<std::string>* skipped) {
  if (!is_object_store_url(root)) return list_checkpoints(root, skipped);
  FP_ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::ObjectTier> tier, open_object_root(root));
  FP_ASSIGN_OR_RETURN(checkpoint::RootScan scan, tier->scan());
  if (skipped != nullptr) {
    for (const checkpoint::DamagedCheckpoint& d : scan.damaged)
      skipped->push_back(d.tag + ": " + d.reason);
  }
  return std::move(scan.committed);
}

Result<std::optional<std::string>> latest_of_any_root(const std::string& root,
                                                      const std::vector<CheckpointInfo>& listed) {
  if (!is_object_store_url(root)) return latest_checkpoint(root);
  if (listed.empty()) return std::optional<std::string>{};
  return std::optional<std::string>(listed.back().tag);
}

std::string scratch_folder() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? std::string(tmp) : std::string("/tmp");
}

}  // namespace fastpersist::cli
