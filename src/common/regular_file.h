// SPDX-License-Identifier: Apache-2.0
// Opening a file that should be a plain file: the one way the library opens a file of a
// checkpoint (or a file a user names) for reading, so that a FIFO, a device or a directory
// planted under that name, or a symbolic link planted inside a checkpoint root, is refused with
// a clear error instead of hanging the reader or leading it out of the root.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <string>

#include "common/unique_fd.h"
#include "fastpersist/status.h"

namespace fastpersist {

enum class Symlinks {
  kFollow,  // a path the user gave: a link to a file is fine
  kRefuse,  // a file inside a checkpoint root: its name must be the file itself
};

struct RegularFile {
  UniqueFd fd;
  uint64_t size = 0;
  struct stat st {};
};

// Opens `path` read-only, never blocking (O_NONBLOCK, which reads of a regular file ignore),
// and checks that it is a regular file before anything reads from it. kNotFound when absent;
// kDataLoss when it is something else ("is a FIFO, not a regular file", "is a symbolic link,
// which a checkpoint never holds"); other errno as they come. `what` names the file in the
// message ("the manifest", "checkpoint file").
Result<RegularFile> open_regular_file(const std::string& path, Symlinks symlinks,
                                      const std::string& what = "file");

// Opens `path` with `access` (O_RDWR or O_WRONLY), creating it (mode 0644) when absent: for the
// lock and record files that live next to the files they guard. Never through a symbolic link
// in the last component (nothing is created or truncated outside the directory), never blocking,
// and only a regular file (kDataLoss names what it is otherwise).
Result<UniqueFd> open_or_create_regular_file(const std::string& path, int access,
                                             const std::string& what = "file");

// The whole content of the small regular file `path` (opened with open_regular_file), of at
// most `max_bytes`: kDataLoss names the size when it is larger, before anything is allocated.
Result<std::string> read_small_regular_file(const std::string& path, size_t max_bytes,
                                            Symlinks symlinks, const std::string& what = "file");

// Whether the open file `fd` is a regular file (kDataLoss naming what it is otherwise).
Status check_regular_file(int fd, const std::string& path, const std::string& what = "file");

}  // namespace fastpersist
