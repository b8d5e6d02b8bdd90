// SPDX-License-Identifier: Apache-2.0
// The files a manifest names, on disk: where each lies (its own directory, or another
// checkpoint of the root for a v2 reference) and the cheap checks that listing and opening
// run on them. A manifest is untrusted input: its names passed decode_manifest's syntax
// checks, and here a reference is also refused when a symbolic link stands on its way.
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "checkpoint/checkpoint_fs.h"
#include "common/printable.h"

namespace fastpersist::checkpoint {
namespace {

Status damaged_reference(const ManifestFile& file, const std::string& path,
                         const std::string& problem) {
  return Status(StatusCode::kDataLoss,
                "checkpoint file " + printable(file.name) + " refers to checkpoint '" +
                    std::string(referenced_checkpoint(file)) + "', " + problem)
      .with_path(path);
}

}  // namespace

Result<std::string> resolve_manifest_file(const std::string& dir, const ManifestFile& file) {
  std::string path = manifest_file_path(dir, file);
  std::string_view tag = referenced_checkpoint(file);
  if (tag.empty()) return path;
  // path is <root>/<tag>/<name>: its last two components are the tag and a plain name.
  std::string target_dir = path.substr(0, path.size() - (file.name.size() - tag.size()));
  struct stat st {};
  if (::lstat(target_dir.c_str(), &st) != 0) {
    int err = errno;
    return damaged_reference(file, target_dir,
                             err == ENOENT ? "which is not in the root (removed?)"
                                           : "which cannot be examined: " + std::string(strerror(err)));
  }
  if (S_ISLNK(st.st_mode)) {
    return damaged_reference(file, target_dir,
                             "which is a symbolic link (a reference never leaves the root)");
  }
  if (!S_ISDIR(st.st_mode)) return damaged_reference(file, target_dir, "which is not a directory");
  const std::string manifest = join_path(target_dir, kManifestFileName);
  if (::lstat(manifest.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return damaged_reference(file, manifest,
                             "which is not a committed checkpoint (it has no manifest.json)");
  }
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    return damaged_reference(file, path,
                             "whose file is a symbolic link (a reference never leaves the root)");
  }
  return path;
}

Status check_manifest_files(const std::string& dir, const Manifest& manifest) {
  for (const ManifestFile& f : manifest.files) {
    FP_ASSIGN_OR_RETURN(std::string path, resolve_manifest_file(dir, f));
    auto size = file_size(path);
    if (!size.is_ok()) {
      const bool missing = size.status().code() == StatusCode::kNotFound;
      return Status(StatusCode::kDataLoss, "checkpoint file " + printable(f.name) +
                                               (missing ? " is missing" : " is " + size.status().message()))
          .with_path(path);
    }
    if (*size != f.size) {
      return Status(StatusCode::kDataLoss, "checkpoint file " + printable(f.name) + " is " +
                                               std::to_string(*size) + " bytes, the manifest says " +
                                               std::to_string(f.size) + " (truncated or replaced)")
          .with_path(path);
    }
  }
  return Status::ok();
}

}  // namespace fastpersist::checkpoint
