// SPDX-License-Identifier: Apache-2.0
// Reads a file front to back through the engine in large aligned windows, two in flight, and
// hands each window to a callback in order: checksumming a whole checkpoint without holding it
// in memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "fastpersist/io_engine.h"
#include "fastpersist/status.h"

namespace fastpersist::checkpoint {

// Calls `consume(file_offset, data, bytes)` for consecutive pieces covering [0, size). The
// first error of a read or of `consume` stops the stream and is returned.
// `before_read` (optional) runs before each read is submitted: it may wait (pacing) or stop
// the stream with an error.
Status stream_file(const std::string& path, uint64_t size, IoEngine& engine,
                   const std::function<Status(uint64_t, const std::byte*, size_t)>& consume,
                   size_t window_bytes = size_t{32} << 20,
                   const std::function<Status()>& before_read = {});

}  // namespace fastpersist::checkpoint
