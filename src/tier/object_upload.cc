// SPDX-License-Identifier: Apache-2.0
// Uploading a committed checkpoint into an object tier (object_tier.h): every own file streamed
// once from the local copy through the same check as `fastpersist verify`, cut into parts that go
// up in parallel; then the manifest, the commit marker; then `latest`.
#include <algorithm>
#include <set>
#include <utility>

#include "checkpoint_dir/checkpoint_fs.h"
#include "common/regular_file.h"
#include "fastpersist/layout.h"
#include "fastpersist/manifest_index.h"
#include "load/verify_file.h"
#include "tier/object_tier.h"
#include "tier/part_upload.h"

namespace fastpersist::checkpoint {
namespace {

// Each read window: small, so that a paused copy has little in flight (as copy_checkpoint's).
constexpr size_t kUploadWindowBytes = size_t{8} << 20;

std::string key_in(const std::string& tag, std::string_view name) {
  return tag + "/" + std::string(name);
}

}  // namespace

Result<CopyResult> ObjectTier::upload(const std::string& local_root, const std::string& tag,
                                      IoEngine& read_engine, const CopyPacer& pacer) {
  FP_RETURN_IF_ERROR(validate_tag(tag));
  const std::string dir = join_path(local_root, tag);
  const std::string manifest_path = join_path(dir, kManifestFileName);
  // The local manifest's own bytes go up as they are: the tier's copy is the same checkpoint.
  auto json =
      read_small_regular_file(manifest_path, kMaxManifestBytes, Symlinks::kRefuse, "the manifest");
  if (!json.is_ok()) return json.status();
  FP_ASSIGN_OR_RETURN(Manifest m, decode_manifest(*json, manifest_path));

  // Already committed there: nothing to do. Objects of a drain that died: removed first.
  if (Status cleared = clear_uncommitted(tag); !cleared.is_ok()) {
    if (cleared.code() == StatusCode::kAlreadyExists) return CopyResult{};
    return cleared;
  }
  // An incremental checkpoint's bases must be in the tier already (plan_drain sends them first).
  std::set<std::string> base_files;
  for (const ManifestFile& f : m.files) {
    if (!referenced_checkpoint(f).empty()) base_files.insert(f.name);
  }
  if (!base_files.empty()) {
    for (const std::string& base : referenced_tags(m)) {
      FP_ASSIGN_OR_RETURN(std::vector<ObjectEntry> there, store_->list(base + "/"));
      for (const ObjectEntry& e : there) base_files.erase(e.key);
    }
    if (!base_files.empty()) {
      return Status(StatusCode::kDataLoss, "checkpoint '" + tag + "' references " +
                                               *base_files.begin() + ", which " + url_ +
                                               " does not hold (its base must be drained first)");
    }
  }

  const ManifestIndex index(m);
  CopyResult result{true, 0};
  PartUploader parts(*store_, transfer_.part_bytes, transfer_.transfers);
  Status st;
  for (size_t i = 0; i < m.files.size() && st.is_ok(); ++i) {
    const ManifestFile& f = m.files[i];
    if (!referenced_checkpoint(f).empty()) continue;
    auto from = resolve_manifest_file(dir, f);
    if (!from.is_ok()) {
      st = from.status();
      break;
    }
    st = parts.begin(key_in(tag, f.name), f.size);
    if (!st.is_ok()) break;
    uint64_t checked = 0;
    FileCheck io{read_engine, nullptr, &checked, nullptr, 0, kUploadWindowBytes, nullptr, dir};
    if (pacer) io.before_read = [&] { return pacer(result.bytes); };
    io.sink = [&](uint64_t, const std::byte* data, size_t n) -> Status {
      FP_RETURN_IF_ERROR(parts.feed(data, n));
      result.bytes += n;
      return Status::ok();
    };
    std::vector<std::string> problems;
    st = check_checkpoint_file(*from, m, i, index.tensors_in(i), io, problems);
    if (st.is_ok() && !problems.empty()) {
      std::string more =
          problems.size() > 1 ? " (and " + std::to_string(problems.size() - 1) + " more)" : "";
      st = Status(StatusCode::kDataLoss,
                  "checkpoint '" + tag + "' is damaged: " + problems.front() + more)
               .with_path(*from);
    }
    // The file's last part goes; it completes in the background while the next file is read.
    if (st.is_ok()) st = parts.end();
  }
  if (st.is_ok()) {
    st = parts.finish_all();
  } else {
    parts.abort_all();
  }
  // The commit marker, once every file is there.
  if (st.is_ok())
    st = store_->put(key_in(tag, kManifestFileName), std::as_bytes(std::span<const char>(*json)));
  if (!st.is_ok()) {
    (void)clear_uncommitted(tag);  // best effort: a later drain removes what is left
    return st;
  }
  FP_RETURN_IF_ERROR(write_latest());
  return result;
}

}  // namespace fastpersist::checkpoint
