// SPDX-License-Identifier: Apache-2.0
// The checkpoint subcommands on an object-store tier ("s3://bucket/run1", docs/tiers.md): the
// same listing, verification and retention as for a root directory, through the object tier of
// the library (src/checkpoint/object_tier.h). The store itself comes from the process's opener:
// the `fastpersist` executable has none, so a command line naming a URL is handed to the Python
// package, which installs one (boto3) and runs the same commands in-process (run_cli.h).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/object_tier.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/status.h"

namespace fastpersist::cli {

// The object tier at `url`, with the default transfer settings.
Result<std::unique_ptr<checkpoint::ObjectTier>> open_object_root(const std::string& url);

// list_checkpoints(root, skipped), for a directory or an object-store URL.
Result<std::vector<CheckpointInfo>> list_any_root(const std::string& root,
                                                  std::vector<std::string>* skipped);
// latest_checkpoint(root) for a directory; for a URL the newest of `listed`.
Result<std::optional<std::string>> latest_of_any_root(const std::string& root,
                                                      const std::vector<CheckpointInfo>& listed);

// Where object tiers are fetched to be verified: $TMPDIR, else /tmp.
std::string scratch_folder();

}  // namespace fastpersist::cli
