// SPDX-License-Identifier: Apache-2.0
#include "checkpoint/retention.h"

#include <algorithm>

namespace fastpersist::checkpoint {

std::vector<std::string> select_for_removal(const std::vector<CheckpointInfo>& committed,
                                            std::optional<unsigned> keep_last,
                                            std::optional<int64_t> keep_every) {
  std::vector<std::string> remove;
  if (!keep_last || committed.empty()) return remove;  // keep_every alone keeps everything
  size_t keep = std::max<size_t>(*keep_last, 1);       // the newest always stays
  if (committed.size() <= keep) return remove;
  size_t first_kept = committed.size() - keep;
  for (size_t i = 0; i < first_kept; ++i) {
    const CheckpointInfo& c = committed[i];
    bool milestone = keep_every && *keep_every > 0 && c.step && *c.step % *keep_every == 0;
    if (!milestone) remove.push_back(c.tag);
  }
  return remove;
}

}  // namespace fastpersist::checkpoint
