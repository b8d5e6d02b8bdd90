// SPDX-License-Identifier: Apache-2.0
#include "fastpersist/file_reader.h"

#include <sys/stat.h>

#include <cerrno>

#include "common/prefault.h"

namespace fastpersist {

Result<std::shared_ptr<PinnedBuffer>> read_whole_file(const std::string& path, IoEngine& engine) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return Status::from_errno(errno, "cannot stat file").with_path(path);
  if (S_ISDIR(st.st_mode))
    return Status(StatusCode::kIoError, "path is a directory", EISDIR).with_path(path);
  auto size = static_cast<uint64_t>(st.st_size);
  FP_ASSIGN_OR_RETURN(PinnedBuffer buffer, PinnedBuffer::allocate(size, /*lock_memory=*/false));
  auto shared = std::make_shared<PinnedBuffer>(std::move(buffer));
  prefault_memory({{shared->data(), shared->capacity()}});
  IoRequest r{IoKind::kRead, shared->data(), size, path, -1, 0};
  FP_ASSIGN_OR_RETURN(uint64_t done, engine.run(r));
  (void)done;
  return shared;
}

}  // namespace fastpersist
