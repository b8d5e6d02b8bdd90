// SPDX-License-Identifier: Apache-2.0
// The snapshot's one copy (private to src/checkpoint): bytes of a source tensor into a staging
// window, hashed right after they are copied, while they are still in cache. Host memory is
// copied in 1 MiB pieces, each hashed at once; device memory in one DMA (one synchronization)
// and then hashed from the window. Both data-file writers (raw and encoded) stage through here.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fastpersist/checksum.h"
#include "fastpersist/pinned_buffer.h"
#include "fastpersist/status.h"
#include "fastpersist/tensor_source.h"

namespace fastpersist::checkpoint {

struct StagingHash {
  Xxh3Stream* stream = nullptr;  // null: no checksum
  double* seconds = nullptr;     // time spent hashing is added here
};

// Copies bytes [pos, pos + bytes) of `source` to `dst`, which lies inside `window` (a device
// copy needs to know the pinned buffer it lands in), and feeds them to `hash`.
Status stage_bytes(const TensorSource& source, uint64_t pos, size_t bytes, PinnedBuffer& window,
                   std::byte* dst, const StagingHash& hash);

// Feeds `bytes` bytes at `data` to `hash` in 1 MiB pieces, timing it.
void hash_staged(const std::byte* data, size_t bytes, const StagingHash& hash);

}  // namespace fastpersist::checkpoint
