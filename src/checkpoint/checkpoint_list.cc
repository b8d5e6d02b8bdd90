// SPDX-License-Identifier: Apache-2.0
// Listing a root: which directories are committed checkpoints (cheap checks only: the manifest
// decodes and every file it names has the recorded size), and which one is the latest.
#include <sys/stat.h>

#include <algorithm>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_fs.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/manifest.h"

namespace fastpersist {
namespace {

// The manifest of `dir` if the directory passes the cheap checks.
Result<Manifest> committed_manifest(const std::string& dir) {
  FP_ASSIGN_OR_RETURN(Manifest m, read_manifest(dir));
  FP_RETURN_IF_ERROR(checkpoint::check_manifest_files(dir, m));
  return m;
}

}  // namespace

Result<std::vector<CheckpointInfo>> list_checkpoints(const std::string& root,
                                                     std::vector<std::string>* skipped) {
  FP_ASSIGN_OR_RETURN(std::vector<std::string> names, checkpoint::list_dir(root));
  std::vector<CheckpointInfo> out;
  for (const std::string& name : names) {
    if (!validate_tag(name).is_ok()) continue;  // hidden, temporary, the pointer, foreign names
    std::string dir = checkpoint::join_path(root, name);
    // Only directories can be checkpoints: a user's file (train.log) is not damage.
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
    auto m = committed_manifest(dir);
    if (!m.is_ok()) {
      // Directories without a manifest at all are not checkpoints (e.g. user's own folders).
      if (m.status().code() != StatusCode::kNotFound && skipped != nullptr) {
        skipped->push_back(name + ": " + m.status().to_string());
      }
      continue;
    }
    CheckpointInfo info;
    info.tag = name;
    info.step = m->step;
    info.sequence = m->sequence;
    info.created_unix = m->created_unix;
    info.tensor_bytes = m->tensor_bytes();
    info.num_tensors = m->tensors.size();
    for (const ManifestFile& f : m->files) info.total_bytes += f.size;
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(), [](const CheckpointInfo& a, const CheckpointInfo& b) {
    return a.sequence != b.sequence ? a.sequence < b.sequence : a.tag < b.tag;
  });
  return out;
}

Result<std::optional<std::string>> latest_checkpoint(const std::string& root) {
  // The newest committed checkpoint by commit order. The `latest` file says the same for other
  // tools; it may lag by one after a crash between the commit and its update, so it is not
  // what this answer is based on.
  FP_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, list_checkpoints(root));
  if (all.empty()) return std::optional<std::string>();
  return std::optional<std::string>(all.back().tag);
}

}  // namespace fastpersist
