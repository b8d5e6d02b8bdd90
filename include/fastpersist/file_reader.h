// SPDX-License-Identifier: Apache-2.0
// Whole-file reads at the speed of the storage: the file lands in one page-aligned buffer,
// read with parallel O_DIRECT requests by the engine. Used by fastpersist.load.
#pragma once

#include <memory>
#include <string>

#include "fastpersist/io_engine.h"
#include "fastpersist/pinned_buffer.h"
#include "fastpersist/status.h"

namespace fastpersist {

// The whole content of `path` (size() == file size). The buffer is page-aligned but not locked.
// Errors: kNotFound, kIoError (with errno), kInvalidArgument for a directory.
Result<std::shared_ptr<PinnedBuffer>> read_whole_file(const std::string& path, IoEngine& engine);

}  // namespace fastpersist
