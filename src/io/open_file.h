// SPDX-License-Identifier: Apache-2.0
// OpenFile: the descriptors a request works on. The aligned body of a transfer goes through
// `direct_fd` (O_DIRECT) when the filesystem accepts it; everything else through `buffered_fd`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/unique_fd.h"
#include "fastpersist/io_engine.h"

namespace fastpersist::io {

struct OpenFile {
  std::string path;      // for error messages ("fd 7" for a caller's descriptor)
  UniqueFd direct_fd;    // invalid when O_DIRECT is not used for this file
  UniqueFd buffered_fd;  // always valid
  FileIoMode mode;
  // Offsets and lengths at which the transfer is split between buffered and direct parts. At
  // least the page size and the filesystem block, so buffered and direct I/O never share a page.
  uint64_t split_alignment = 4096;
};

// Opens the file a request names (by path or the caller's fd), applying the engine's rules:
// a write by path truncates only when the request asks for it; O_DIRECT is attempted when
// `want_direct`, with fallback; reads past the end of the file are rejected here.
Result<std::shared_ptr<OpenFile>> open_for_request(const IoRequest& request, bool want_direct);

// O_DIRECT alignment requirements of an open file (statx STATX_DIOALIGN, else the block
// device's logical block size, else 4096).
FileIoMode direct_io_alignment(int fd);

}  // namespace fastpersist::io
