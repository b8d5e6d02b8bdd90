// SPDX-License-Identifier: Apache-2.0
// Making an incremental checkpoint standalone (`fastpersist convert --materialize`,
// CheckpointManager::materialize): every base file it references is copied into its own
// directory, then its manifest is replaced, atomically, by one that names the copies. Before the
// manifest's rename the checkpoint is what it was (the copies are unlisted files, replaced by
// the next attempt); after it, it no longer needs its base, which retention may then remove.
// The tag, step, sequence, checksums and every tensor's offset stay as they were.
//
// The caller holds the root's lock and makes sure no save uses the checkpoint (the manager).
#pragma once

#include <string>

#include "fastpersist/status.h"

namespace fastpersist::checkpoint {

// The name a copied base file takes in the checkpoint: "from-<tag>-<name>" (neither a data
// file nor a manifest name of the writer's, so it can clash with nothing of its own).
std::string materialized_file_name(const std::string& base_tag, const std::string& file_name);

// Materializes the committed checkpoint <root>/<tag>. Returns the bytes copied (0: it
// referenced nothing). kNotFound for no such checkpoint; kDataLoss when it, or a file it
// references, fails the cheap checks (missing, wrong size, a symbolic link on the way).
Result<uint64_t> materialize_checkpoint(const std::string& root, const std::string& tag,
                                        bool durable);

}  // namespace fastpersist::checkpoint
