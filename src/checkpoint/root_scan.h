// SPDX-License-Identifier: Apache-2.0
// What one pass over a checkpoint root tells, beyond the public scan (maintenance.h: RootScan,
// DamagedCheckpoint, scan_root): the helpers that build a scan's entries and follow the
// references between checkpoints (private to src/checkpoint).
#pragma once

#include <string>
#include <vector>

#include "fastpersist/checkpoint.h"
#include "fastpersist/maintenance.h"
#include "fastpersist/manifest.h"
#include "fastpersist/status.h"

namespace fastpersist::checkpoint {

// The public scan's types, by their names inside the library.
using fastpersist::DamagedCheckpoint;
using fastpersist::RootScan;
using fastpersist::scan_root;

// What list_checkpoints says of a committed checkpoint TAG with manifest `m`.
CheckpointInfo info_of(const std::string& tag, const Manifest& m);
// A damaged checkpoint TAG, with what its manifest still tells when it decodes.
DamagedCheckpoint damaged_of(const std::string& tag, std::string reason, const Result<Manifest>& m);

// referenced_checkpoints (maintenance.h), by its name inside the library.
inline std::vector<std::string> referenced_tags(const Manifest& manifest) {
  return referenced_checkpoints(manifest);
}

// The checkpoints of `scan` (committed or damaged) that reference `tag`, in scan order.
std::vector<std::string> referencing(const RootScan& scan, const std::string& tag);

}  // namespace fastpersist::checkpoint
