// SPDX-License-Identifier: Apache-2.0
// seal_folder / check_sealed_folder (folder_seal.h): a marker of sizes and XXH3-64 checksums,
// written last, over a folder another writer filled.
#include "fastpersist/folder_seal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <nlohmann/json.hpp>
#include <vector>

#include "checkpoint_dir/checkpoint_fs.h"
#include "common/unique_fd.h"
#include "fastpersist/checksum.h"

namespace fastpersist {
namespace {

using Json = nlohmann::json;
constexpr size_t kChunkBytes = size_t{8} << 20;
constexpr const char* kFormat = "fastpersist-sealed-folder";
// A marker lists a folder's files: far below this in any real checkpoint folder.
constexpr size_t kMaxMarkerBytes = size_t{16} << 20;

// The size and XXH3-64 of the regular file `path`, after an fdatasync when `durable`.
Result<SealedFile> hash_file(const std::string& path, const std::string& name, bool durable) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return Status::from_errno(errno, "cannot open a file to seal").with_path(path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0)
    return Status::from_errno(errno, "cannot examine a file to seal").with_path(path);
  if (!S_ISREG(st.st_mode))
    return Status(StatusCode::kInvalidArgument, "not a regular file").with_path(path);
  if (durable && ::fdatasync(fd.get()) != 0)
    return Status::from_errno(errno, "cannot sync a file to seal").with_path(path);
  (void)::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<std::byte> chunk(kChunkBytes);
  Xxh3Stream hash;
  uint64_t done = 0;
  for (;;) {
    ssize_t n = ::pread(fd.get(), chunk.data(), chunk.size(), static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::from_errno(errno, "cannot read a file to seal").with_path(path);
    if (n == 0) break;
    hash.update(chunk.data(), static_cast<size_t>(n));
    done += static_cast<uint64_t>(n);
  }
  return SealedFile{name, done, hash.digest()};
}

Result<std::vector<std::string>> folder_files(const std::string& dir) {
  FP_ASSIGN_OR_RETURN(std::vector<std::string> names, checkpoint::list_dir(dir));
  std::vector<std::string> files;
  for (const std::string& name : names) {
    if (name == kFolderSealName) continue;
    std::string path = checkpoint::join_path(dir, name);
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0)
      return Status::from_errno(errno, "cannot examine a file to seal").with_path(path);
    if (!S_ISREG(st.st_mode)) {
      return Status(StatusCode::kInvalidArgument,
                    "only regular files directly in the folder can be sealed")
          .with_path(path);
    }
    files.push_back(name);
  }
  std::sort(files.begin(), files.end());
  return files;
}

SealCheck damaged(std::string problem) { return {SealState::kDamaged, std::move(problem)}; }

}  // namespace

Result<std::vector<SealedFile>> seal_folder(const std::string& dir, bool durable,
                                            const std::vector<SealedFile>& known) {
  FP_ASSIGN_OR_RETURN(std::vector<std::string> names, folder_files(dir));
  for (const SealedFile& k : known) {
    if (!std::binary_search(names.begin(), names.end(), k.name)) {
      return Status(StatusCode::kNotFound, "a file recorded as written is not in the folder")
          .with_path(checkpoint::join_path(dir, k.name));
    }
  }
  std::vector<SealedFile> sealed;
  Json files = Json::array();
  for (const std::string& name : names) {
    std::string path = checkpoint::join_path(dir, name);
    auto record = std::find_if(known.begin(), known.end(),
                               [&](const SealedFile& k) { return k.name == name; });
    SealedFile f;
    if (record != known.end()) {
      FP_ASSIGN_OR_RETURN(uint64_t size, checkpoint::file_size(path));
      if (size != record->size) {
        return Status(StatusCode::kDataLoss, "the file has " + std::to_string(size) +
                                                 " bytes, its writer recorded " +
                                                 std::to_string(record->size))
            .with_path(path);
      }
      f = *record;
    } else {
      FP_ASSIGN_OR_RETURN(f, hash_file(path, name, durable));
    }
    files.push_back(
        {{"name", f.name}, {"size", f.size}, {"checksum", checksum_to_hex(f.checksum)}});
    sealed.push_back(std::move(f));
  }
  Json marker = {{"format", kFormat}, {"version", 1}, {"files", std::move(files)}};
  FP_RETURN_IF_ERROR(checkpoint::replace_file_atomically(
      checkpoint::join_path(dir, kFolderSealName), marker.dump(1) + "\n", durable));
  if (durable) FP_RETURN_IF_ERROR(checkpoint::fsync_dir(dir));
  return sealed;
}

Result<SealCheck> check_sealed_folder(const std::string& dir, bool checksums) {
  std::string marker_path = checkpoint::join_path(dir, kFolderSealName);
  struct stat st;
  if (::lstat(marker_path.c_str(), &st) != 0) {
    if (errno == ENOENT) return SealCheck{};
    return Status::from_errno(errno, "cannot examine the seal").with_path(marker_path);
  }
  Result<std::string> text = checkpoint::read_small_file(marker_path, kMaxMarkerBytes);
  if (!text.is_ok()) return damaged("the seal cannot be read: " + text.status().to_string());
  Json marker = Json::parse(text.value(), nullptr, /*allow_exceptions=*/false);
  if (!marker.is_object() || marker.value("format", "") != kFormat || !marker.contains("files") ||
      !marker["files"].is_array()) {
    return damaged("the seal " + marker_path + " is not a fastpersist seal");
  }
  for (const Json& entry : marker["files"]) {
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
        !entry.contains("size") || !entry["size"].is_number_unsigned() ||
        !entry.contains("checksum") || !entry["checksum"].is_string()) {
      return damaged("the seal " + marker_path + " has a malformed entry");
    }
    std::string name = entry["name"].get<std::string>();
    std::optional<uint64_t> want = checksum_from_hex(entry["checksum"].get<std::string>());
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == ".." ||
        !want) {
      return damaged("the seal " + marker_path + " names a file it cannot: '" + name + "'");
    }
    std::string path = checkpoint::join_path(dir, name);
    uint64_t size = entry["size"].get<uint64_t>();
    if (!checksums) {
      Result<uint64_t> have = checkpoint::file_size(path);
      if (!have.is_ok()) return damaged(name + " is missing: " + have.status().to_string());
      if (have.value() != size) {
        return damaged(name + " has " + std::to_string(have.value()) + " bytes, the seal says " +
                       std::to_string(size));
      }
      continue;
    }
    Result<SealedFile> have = hash_file(path, name, /*durable=*/false);
    if (!have.is_ok()) return damaged(name + ": " + have.status().to_string());
    if (have.value().size != size || have.value().checksum != *want) {
      return damaged(name + " differs from the seal (" + std::to_string(have.value().size) +
                     " bytes, xxh3-64 " + checksum_to_hex(have.value().checksum) + "; sealed " +
                     std::to_string(size) + " bytes, " + checksum_to_hex(*want) + ")");
    }
  }
  return SealCheck{SealState::kSealed, ""};
}

}  // namespace fastpersist
