// SPDX-License-Identifier: Apache-2.0
// Listing a root: which directories are committed checkpoints (cheap checks only: the manifest
// decodes and every file it names has the recorded size), which are damaged, and which one is
// the latest.
#include <sys/stat.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/root_scan.h"
#include "checkpoint_dir/checkpoint_fs.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/manifest.h"

namespace fastpersist {
namespace checkpoint {

CheckpointInfo info_of(const std::string& tag, const Manifest& m) {
  CheckpointInfo info;
  info.tag = tag;
  info.step = m.step;
  info.sequence = m.sequence;
  info.created_unix = m.created_unix;
  info.tensor_bytes = m.tensor_bytes();
  info.num_tensors = m.tensors.size();
  for (const ManifestFile& f : m.files) {
    info.total_bytes += f.size;
    if (referenced_checkpoint(f).empty()) info.own_bytes += f.size;
  }
  info.references = referenced_tags(m);
  return info;
}

DamagedCheckpoint damaged_of(const std::string& tag, std::string reason,
                             const Result<Manifest>& m) {
  DamagedCheckpoint d{tag, std::move(reason), std::nullopt, std::nullopt, {}};
  if (m.is_ok()) {
    d.sequence = m->sequence;
    d.step = m->step;
    d.references = referenced_tags(*m);
  }
  return d;
}

}  // namespace checkpoint

std::vector<std::string> referenced_checkpoints(const Manifest& manifest) {
  std::set<std::string> tags;
  for (const ManifestFile& f : manifest.files) {
    std::string_view tag = referenced_checkpoint(f);
    if (!tag.empty()) tags.emplace(tag);
  }
  return {tags.begin(), tags.end()};
}

namespace checkpoint {

std::vector<std::string> referencing(const RootScan& scan, const std::string& tag) {
  std::vector<std::string> out;
  auto refers = [&](const std::vector<std::string>& refs) {
    return std::find(refs.begin(), refs.end(), tag) != refs.end();
  };
  for (const CheckpointInfo& c : scan.committed) {
    if (refers(c.references)) out.push_back(c.tag);
  }
  for (const DamagedCheckpoint& d : scan.damaged) {
    if (refers(d.references)) out.push_back(d.tag);
  }
  return out;
}

}  // namespace checkpoint

uint64_t RootScan::highest_sequence() const {
  uint64_t high = 0;
  for (const CheckpointInfo& c : committed) high = std::max(high, c.sequence);
  for (const DamagedCheckpoint& d : damaged) high = std::max(high, d.sequence.value_or(0));
  return high;
}

Result<RootScan> scan_root(const std::string& root) {
  using checkpoint::check_manifest_files;
  using checkpoint::damaged_of;
  using checkpoint::info_of;
  using checkpoint::join_path;
  using checkpoint::list_dir;
  FP_ASSIGN_OR_RETURN(std::vector<std::string> names, list_dir(root));
  std::sort(names.begin(), names.end());
  RootScan scan;
  for (const std::string& name : names) {
    if (!validate_tag(name).is_ok()) continue;  // hidden, temporary, the pointer, foreign names
    std::string dir = join_path(root, name);
    // Only directories can be checkpoints: a user's file (train.log) is not damage.
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0) continue;
    if (S_ISLNK(st.st_mode)) {
      // A checkpoint the manager committed is a directory; a link under a tag's name could
      // make readers (and a reference from another checkpoint) read outside the root.
      struct stat target {};
      if (::stat(dir.c_str(), &target) == 0 && S_ISDIR(target.st_mode)) {
        scan.damaged.push_back({name,
                                "a symbolic link to a directory, which fastpersist does "
                                "not follow inside a root (refused: it could lead out of it)",
                                std::nullopt,
                                std::nullopt,
                                {}});
      }
      continue;
    }
    if (!S_ISDIR(st.st_mode)) continue;
    Result<Manifest> m = read_manifest(dir);
    // Directories without a manifest at all are not checkpoints (e.g. user's own folders).
    if (!m.is_ok() && m.status().code() == StatusCode::kNotFound) continue;
    Status files = m.is_ok() ? check_manifest_files(dir, *m) : m.status();
    if (files.is_ok()) {
      scan.committed.push_back(info_of(name, *m));
      continue;
    }
    scan.damaged.push_back(damaged_of(name, files.to_string(), m));
  }
  std::sort(scan.committed.begin(), scan.committed.end(),
            [](const CheckpointInfo& a, const CheckpointInfo& b) {
              return a.sequence != b.sequence ? a.sequence < b.sequence : a.tag < b.tag;
            });
  return scan;
}

Result<std::vector<CheckpointInfo>> list_checkpoints(const std::string& root,
                                                     std::vector<std::string>* skipped) {
  FP_ASSIGN_OR_RETURN(checkpoint::RootScan scan, checkpoint::scan_root(root));
  if (skipped != nullptr) {
    for (const checkpoint::DamagedCheckpoint& d : scan.damaged)
      skipped->push_back(d.tag + ": " + d.reason);
  }
  return std::move(scan.committed);
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
