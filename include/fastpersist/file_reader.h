// SPDX-License-Identifier: Apache-2.0
// Whole-file reads at the speed of the storage: the file lands in one page-aligned buffer,
// read with parallel O_DIRECT requests by the engine. Used by fastpersist.load.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "fastpersist/io_engine.h"
#include "fastpersist/pinned_buffer.h"
#include "fastpersist/status.h"

namespace fastpersist {

// The unit of a read that reports progress: each piece is one parallel request of the engine.
inline constexpr uint64_t kProgressReadChunkBytes = uint64_t{64} << 20;

// The whole content of `path` (size() == file size). The buffer is page-aligned but not locked.
// Errors: kNotFound, kIoError (with errno; EISDIR for a directory).
//
// With `progress`, the file is read in pieces of kProgressReadChunkBytes, one after another,
// each straight into the buffer, and progress(bytes_read, file_size) is called before the first
// and after each (on the calling thread). A file replaced or changed while it is read (device,
// inode, size or modification time differ afterwards) is kIoError with EAGAIN: each piece opens
// the path again, so it could otherwise hold a mix of two files.
Result<std::shared_ptr<PinnedBuffer>> read_whole_file(
    const std::string& path, IoEngine& engine,
    const std::function<void(uint64_t, uint64_t)>& progress = nullptr);

}  // namespace fastpersist
