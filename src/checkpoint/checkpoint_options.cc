// SPDX-License-Identifier: Apache-2.0
// CheckpointOptions::validate (fastpersist/checkpoint.h).
#include "fastpersist/checkpoint.h"

namespace fastpersist {

Status CheckpointOptions::validate() const {
  FP_RETURN_IF_ERROR(DataFileOptions::validate());
  auto bad = [](const char* what) { return Status(StatusCode::kInvalidArgument, what); };
  if (max_in_flight == 0) return bad("max_in_flight must be >= 1");
  if (keep_last && *keep_last == 0) {
    return bad("keep_last must be >= 1 (the newest checkpoint is always kept)");
  }
  if (keep_every && *keep_every < 1) return bad("keep_every must be >= 1");
  if (full_every == 0) return bad("full_every must be >= 1 (1: every save is full)");
  if (xor_deltas && !incremental) {
    return bad("xor_deltas needs incremental=True (a delta is taken against the base)");
  }
  return save_policy.validate();
}

}  // namespace fastpersist
