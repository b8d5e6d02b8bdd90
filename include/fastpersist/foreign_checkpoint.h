// SPDX-License-Identifier: Apache-2.0
// Checkpoints that another tool wrote into a fastpersist root: folders without manifest.json
// that hold a checkpoint engine's files. Today: DeepSpeed tags written by its own engines
// (TorchCheckpointEngine, FastCheckpointEngine) next to the tags fastpersist.deepspeed commits.
// They carry no checksums, so nothing can verify them; the CLI lists them as such instead of
// ignoring them, and retention never touches them.
//
// A folder on disk is untrusted: only its own top level is read, symlinks are never followed,
// and nothing is opened.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fastpersist {

struct ForeignTag {
  std::string tag;                 // the folder's name
  std::string kind = "deepspeed";  // which tool wrote it
  uint64_t files = 0;  // its checkpoint files (DeepSpeed: *_model_states.pt, *_optim_states.pt)
  uint64_t bytes = 0;  // their total size
  std::vector<std::pair<std::string, uint64_t>> listing;  // those files and sizes, by name
};

// `dir` as a DeepSpeed tag: a directory (not a symlink) without manifest.json whose top level
// holds at least one regular file named like DeepSpeed's model or optimizer states. nullopt
// otherwise, or when it cannot be read.
std::optional<ForeignTag> detect_deepspeed_tag(const std::string& dir);

// The DeepSpeed tags directly under `root` (folders whose names are valid tags), by name.
std::vector<ForeignTag> deepspeed_tags(const std::string& root);

}  // namespace fastpersist
