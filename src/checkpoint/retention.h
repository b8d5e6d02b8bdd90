// SPDX-License-Identifier: Apache-2.0
// Which committed checkpoints a retention policy removes. Pure: the caller does the removal.
//
// keep_last N keeps the newest N; keep_every K also keeps every checkpoint whose step is a
// multiple of K (milestones). The newest checkpoint is always kept, whatever the policy; with
// neither rule nothing is removed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fastpersist/checkpoint.h"

namespace fastpersist::checkpoint {

// `committed` is oldest to newest (as list_checkpoints returns). Returns the tags to remove.
std::vector<std::string> select_for_removal(const std::vector<CheckpointInfo>& committed,
                                            std::optional<unsigned> keep_last,
                                            std::optional<int64_t> keep_every);

}  // namespace fastpersist::checkpoint
