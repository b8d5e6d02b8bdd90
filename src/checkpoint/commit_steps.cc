// SPDX-License-Identifier: Apache-2.0
// The last steps of the commit protocol (commit_steps.h).
#include "checkpoint/commit_steps.h"

#include <chrono>
#include <cstdio>

#include "checkpoint_dir/checkpoint_fs.h"
#include "fastpersist/layout.h"

namespace fastpersist::checkpoint {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Status commit_temp_directory(const CommitTarget& t, const Manifest& manifest,
                             uint64_t* manifest_bytes) {
  *manifest_bytes = 0;
  std::string text = encode_manifest(manifest);
  FP_RETURN_IF_ERROR(write_new_file(join_path(t.temp_dir, kManifestFileName), text, t.durable));
  if (t.durable) FP_RETURN_IF_ERROR(fsync_dir(t.temp_dir));
  std::unique_lock<std::mutex> pointer_lock;
  if (t.pointer_mu != nullptr) pointer_lock = std::unique_lock(*t.pointer_mu);
  std::string target = join_path(t.root, t.tag);
  Status renamed = rename_no_replace(t.temp_dir, target);
  if (renamed.code() == StatusCode::kAlreadyExists) {
    return Status(StatusCode::kAlreadyExists,
                  "checkpoint '" + t.tag + "' already exists; choose another tag or remove it")
        .with_path(target);
  }
  FP_RETURN_IF_ERROR(renamed);
  if (t.durable) FP_RETURN_IF_ERROR(fsync_dir(t.root));
  // If the pointer cannot be written (ENOSPC), the rename is undone: an error from a save
  // always means that nothing was committed.
  Status pointer =
      replace_file_atomically(join_path(t.root, kLatestFileName), t.tag + "\n", t.durable);
  if (!pointer.is_ok()) {
    std::string trash =
        join_path(t.root, std::string(kTrashDirPrefix) + t.tag + "-" + unique_suffix());
    bool undone = std::rename(target.c_str(), trash.c_str()) == 0;
    if (undone) {
      if (t.durable) (void)fsync_dir(t.root);
      (void)remove_tree(trash);
    }
    return Status(pointer.code(),
                  "cannot update the 'latest' pointer (" + pointer.message() + "); checkpoint '" +
                      t.tag + (undone ? "' was therefore not kept" : "' stays committed"),
                  pointer.sys_errno())
        .with_path(pointer.path());
  }
  *manifest_bytes = text.size();
  return Status::ok();
}

}  // namespace fastpersist::checkpoint
