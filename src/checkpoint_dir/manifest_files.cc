// SPDX-License-Identifier: Apache-2.0
// The files a manifest names, on disk: where each lies (its own directory, or another
// checkpoint of the root for a v2 reference) and the cheap checks that listing and opening
// run on them. A manifest is untrusted input: its names passed decode_manifest's syntax
// checks, and here a reference is also refused when a symbolic link stands on its way.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <utility>

#include "checkpoint_dir/checkpoint_fs.h"
#include "common/printable.h"
#include "fastpersist/layout.h"

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
                             err == ENOENT
                                 ? "which is not in the root (removed?)"
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
      return Status(StatusCode::kDataLoss,
                    "checkpoint file " + printable(f.name) +
                        (missing ? " is missing" : " is " + size.status().message()))
          .with_path(path);
    }
    if (*size != f.size) {
      return Status(StatusCode::kDataLoss, "checkpoint file " + printable(f.name) + " is " +
                                               std::to_string(*size) +
                                               " bytes, the manifest says " +
                                               std::to_string(f.size) + " (truncated or replaced)")
          .with_path(path);
    }
  }
  return Status::ok();
}

namespace {

// What a base records for the stored bytes at one place of one of its files.
struct StoredRecord {
  uint64_t length;  // raw
  uint64_t stored_length;
  std::string encoding;
  uint64_t checksum;
};

// The checkpoint a file name refers into ("" for a file of the checkpoint itself).
std::string referenced_tag(const std::string& name) {
  ManifestFile f;
  f.name = name;
  return std::string(referenced_checkpoint(f));
}

// (file, offset) -> records; several where empty tensors share an offset with the next one.
using BaseRecords = std::multimap<std::pair<std::string, uint64_t>, StoredRecord>;

Result<BaseRecords> records_of(const std::string& root, const std::string& tag) {
  FP_ASSIGN_OR_RETURN(Manifest base, read_manifest(join_path(root, tag)));
  BaseRecords out;
  for (const ManifestTensor& t : base.tensors) {
    if (!referenced_tag(t.file).empty()) continue;  // the base's own bytes only
    out.emplace(std::pair{tag + "/" + t.file, t.offset},
                StoredRecord{t.length, t.stored_length, t.encoding, t.checksum});
  }
  return out;
}

}  // namespace

Status check_references_against_bases(const std::string& dir, const Manifest& manifest) {
  const size_t slash = dir.find_last_of('/');
  const std::string root = slash == std::string::npos ? "."
                           : slash == 0               ? "/"
                                                      : dir.substr(0, slash);
  std::map<std::string, BaseRecords> bases;
  auto check = [&](const std::string& tensor, const std::string& file, uint64_t offset,
                   const StoredRecord& claim, const char* what) -> Status {
    const std::string tag = referenced_tag(file);
    if (tag.empty()) return Status::ok();
    auto it = bases.find(tag);
    if (it == bases.end()) {
      FP_ASSIGN_OR_RETURN(BaseRecords records, records_of(root, tag));
      it = bases.emplace(tag, std::move(records)).first;
    }
    auto [first, last] = it->second.equal_range({file, offset});
    const bool recorded = std::any_of(first, last, [&](const auto& entry) {
      const StoredRecord& r = entry.second;
      return r.length == claim.length && r.stored_length == claim.stored_length &&
             r.encoding == claim.encoding && r.checksum == claim.checksum;
    });
    if (!recorded) {
      return Status(StatusCode::kDataLoss, "tensor " + printable(tensor) + ": its " + what +
                                               " at offset " + std::to_string(offset) + " of " +
                                               printable(file) + " is not what checkpoint '" + tag +
                                               "' records there (a forged or damaged manifest)")
          .with_path(join_path(dir, std::string(kManifestFileName)));
    }
    return Status::ok();
  };
  for (const ManifestTensor& t : manifest.tensors) {
    FP_RETURN_IF_ERROR(check(t.name, t.file, t.offset,
                             {t.length, t.stored_length, t.encoding, t.checksum}, "reference"));
    if (t.delta_base) {
      const DeltaBase& b = *t.delta_base;
      FP_RETURN_IF_ERROR(check(t.name, b.file, b.offset,
                               {t.length, b.stored_length, b.encoding, b.checksum}, "delta base"));
    }
  }
  return Status::ok();
}

}  // namespace fastpersist::checkpoint
