// SPDX-License-Identifier: Apache-2.0
// The check of one file of a checkpoint against its manifest, as verify_checkpoint() runs it for
// every file (private to src/load and the layers above). It reads the file once, front to back, and
// can hand every byte it reads to a sink: a tier's drain copies a checkpoint and verifies it in the
// same read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "fastpersist/io_engine.h"
#include "fastpersist/manifest.h"
#include "fastpersist/status.h"

namespace fastpersist::checkpoint {

// Receives consecutive pieces of the file, [0, size) in order; an error stops the read.
using ByteSink = std::function<Status(uint64_t offset, const std::byte* data, size_t bytes)>;

struct FileCheck {
  IoEngine& engine;
  ByteSink sink;      // optional
  uint64_t* checked;  // bytes read so far, all files together (updated)
  std::function<void(uint64_t, uint64_t)> progress;  // optional: (checked, total)
  uint64_t total = 0;
  size_t window_bytes = size_t{32} << 20;  // each of the two read windows in flight
  std::function<Status()> before_read;     // optional: runs before each read is submitted
  // The checkpoint's directory: where the bases of its XOR deltas are found (manifest.h,
  // DeltaBase). Empty: a delta is reported as not checkable.
  std::string checkpoint_dir;
};

// Checks m.files[file], stored at `path` (resolved by the caller), whose tensors are `tensors`
// (indices into m.tensors): its size, its safetensors header against the manifest, and, when the
// manifest has checksums, the checksum of its leading bytes and of every tensor (compressed
// ones decoded as they stream by). Every problem found is appended to `problems` (a file of the
// wrong size is not read). Returns an error only when reading or the sink failed.
Status check_checkpoint_file(const std::string& path, const Manifest& m, size_t file,
                             std::span<const size_t> tensors, const FileCheck& io,
                             std::vector<std::string>& problems);

}  // namespace fastpersist::checkpoint
