// SPDX-License-Identifier: Apache-2.0
#include "fastpersist/file_reader.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>

#include "common/prefault.h"

namespace fastpersist {

namespace {

bool same_file_state(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino && a.st_size == b.st_size &&
         a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec;
}

}  // namespace

Result<std::shared_ptr<PinnedBuffer>> read_whole_file(
    const std::string& path, IoEngine& engine,
    const std::function<void(uint64_t, uint64_t)>& progress) {
  struct stat before {};
  if (::stat(path.c_str(), &before) != 0)
    return Status::from_errno(errno, "cannot stat file").with_path(path);
  if (S_ISDIR(before.st_mode))
    return Status(StatusCode::kIoError, "path is a directory", EISDIR).with_path(path);
  auto size = static_cast<uint64_t>(before.st_size);
  FP_ASSIGN_OR_RETURN(PinnedBuffer buffer, PinnedBuffer::allocate(size, /*lock_memory=*/false));
  auto shared = std::make_shared<PinnedBuffer>(std::move(buffer));
  prefault_memory({{shared->data(), shared->capacity()}});
  if (!progress) {
    IoRequest r{IoKind::kRead, shared->data(), size, path, -1, 0};
    FP_ASSIGN_OR_RETURN(uint64_t done, engine.run(r));
    (void)done;
    return shared;
  }
  progress(0, size);
  for (uint64_t offset = 0; offset < size; offset += kProgressReadChunkBytes) {
    const uint64_t n = std::min(kProgressReadChunkBytes, size - offset);
    IoRequest r{IoKind::kRead, shared->data() + offset, n, path, -1, offset};
    FP_ASSIGN_OR_RETURN(uint64_t done, engine.run(r));
    (void)done;
    progress(offset + n, size);
  }
  struct stat after {};
  if (::stat(path.c_str(), &after) != 0)
    return Status::from_errno(errno, "cannot stat file").with_path(path);
  if (!same_file_state(before, after)) {
    return Status(StatusCode::kIoError, "the file changed while it was being read", EAGAIN)
        .with_path(path);
  }
  return shared;
}

}  // namespace fastpersist
