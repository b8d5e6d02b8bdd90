// SPDX-License-Identifier: Apache-2.0
#include "incremental/materialize.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <vector>

#include "checkpoint_dir/checkpoint_fs.h"
#include "common/regular_file.h"
#include "common/unique_fd.h"
#include "fastpersist/manifest.h"

namespace fastpersist::checkpoint {
namespace {

// Copies `from` (exactly `size` bytes) into the new file `to`: copy_file_range (a reflink or
// an in-kernel copy where the filesystem offers one), read/write where it does not.
Status copy_file(const std::string& from, const std::string& to, uint64_t size, bool durable) {
  FP_ASSIGN_OR_RETURN(RegularFile src,
                      open_regular_file(from, Symlinks::kRefuse, "referenced file"));
  if (src.size != size) {
    return Status(StatusCode::kDataLoss, "referenced file has " + std::to_string(src.size) +
                                             " bytes, the manifest says " + std::to_string(size))
        .with_path(from);
  }
  UniqueFd dst(::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (dst.get() < 0) return Status::from_errno(errno, "cannot create the copy").with_path(to);
  uint64_t done = 0;
  bool kernel_copy = true;
  std::vector<char> buffer;
  while (done < size) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(size - done, uint64_t{1} << 30));
    ssize_t n = -1;
    if (kernel_copy) {
      n = ::copy_file_range(src.fd.get(), nullptr, dst.get(), nullptr, want, 0);
      if (n < 0 && (errno == EXDEV || errno == ENOSYS || errno == EINVAL || errno == EOPNOTSUPP)) {
        kernel_copy = false;
        continue;
      }
    } else {
      buffer.resize(size_t{8} << 20);
      n = ::read(src.fd.get(), buffer.data(), std::min(want, buffer.size()));
      if (n > 0) {
        for (ssize_t w = 0; w < n;) {
          ssize_t k = ::write(dst.get(), buffer.data() + w, static_cast<size_t>(n - w));
          if (k < 0 && errno == EINTR) continue;
          if (k < 0) return Status::from_errno(errno, "cannot write the copy").with_path(to);
          w += k;
        }
      }
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::from_errno(errno, "cannot copy the referenced file").with_path(from);
    if (n == 0) {
      return Status(StatusCode::kDataLoss,
                    "referenced file ended at byte " + std::to_string(done) + " while being copied")
          .with_path(from);
    }
    done += static_cast<uint64_t>(n);
  }
  if (durable && ::fdatasync(dst.get()) != 0) {
    return Status::from_errno(errno, "cannot sync the copy").with_path(to);
  }
  return Status::ok();
}

}  // namespace

std::string materialized_file_name(const std::string& base_tag, const std::string& file_name) {
  return "from-" + base_tag + "-" + file_name;
}

Result<uint64_t> materialize_checkpoint(const std::string& root, const std::string& tag,
                                        bool durable) {
  const std::string dir = join_path(root, tag);
  FP_ASSIGN_OR_RETURN(Manifest m, read_manifest(dir));
  FP_RETURN_IF_ERROR(check_manifest_files(dir, m));
  std::map<std::string, std::string> renamed;  // reference -> its copy's name
  uint64_t copied = 0;
  for (ManifestFile& f : m.files) {
    std::string_view base = referenced_checkpoint(f);
    if (base.empty()) continue;
    const std::string plain = f.name.substr(base.size() + 1);
    std::string copy = materialized_file_name(std::string(base), plain);
    if (m.find_file(copy) != nullptr) {
      return Status(StatusCode::kDataLoss, "the manifest already names a file '" + copy + "'")
          .with_path(dir);
    }
    FP_ASSIGN_OR_RETURN(std::string from, resolve_manifest_file(dir, f));
    const std::string to = join_path(dir, copy);
    // A copy an interrupted attempt left (unlisted, so nothing reads it) is made again.
    if (::unlink(to.c_str()) != 0 && errno != ENOENT) {
      return Status::from_errno(errno, "cannot replace an earlier partial copy").with_path(to);
    }
    FP_RETURN_IF_ERROR(copy_file(from, to, f.size, durable));
    copied += f.size;
    renamed.emplace(f.name, copy);
  }
  if (renamed.empty()) return uint64_t{0};
  if (durable) FP_RETURN_IF_ERROR(fsync_dir(dir));  // the copies' names, before the manifest
  for (ManifestFile& f : m.files) {
    auto it = renamed.find(f.name);
    if (it != renamed.end()) f.name = it->second;
  }
  for (ManifestTensor& t : m.tensors) {
    auto it = renamed.find(t.file);
    if (it != renamed.end()) t.file = it->second;
    if (t.delta_base) {
      auto base = renamed.find(t.delta_base->file);
      if (base != renamed.end()) t.delta_base->file = base->second;
    }
  }
  FP_RETURN_IF_ERROR(
      replace_file_atomically(join_path(dir, kManifestFileName), encode_manifest(m), durable));
  return copied;
}

}  // namespace fastpersist::checkpoint
