// SPDX-License-Identifier: Apache-2.0
#include "write/staging_copy.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "buffer/device_copy.h"

namespace fastpersist::checkpoint {
namespace {
// Copy granule: small enough that the checksum pass reads the bytes from cache.
constexpr size_t kCopyChunk = size_t{1} << 20;
}  // namespace

void hash_staged(const std::byte* data, size_t bytes, const StagingHash& hash) {
  if (hash.stream == nullptr) return;
  auto t0 = std::chrono::steady_clock::now();
  for (size_t off = 0; off < bytes; off += kCopyChunk) {
    hash.stream->update(data + off, std::min(kCopyChunk, bytes - off));
  }
  if (hash.seconds != nullptr) {
    *hash.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
}

Status stage_bytes(const TensorSource& source, uint64_t pos, size_t bytes, PinnedBuffer& window,
                   std::byte* dst, const StagingHash& hash) {
  if (source.device >= 0) {
    Status st = buffer::prepare_copy_target(window, source.device);
    if (st.is_ok()) st = buffer::copy_from_device(dst, source.data + pos, bytes, source.device);
    if (!st.is_ok())
      return Status(st.code(), "snapshot of tensor '" + source.name + "': " + st.message());
    hash_staged(dst, bytes, hash);
    return Status::ok();
  }
  for (size_t done = 0; done < bytes;) {
    size_t take = std::min(kCopyChunk, bytes - done);
    std::memcpy(dst + done, source.data + pos + done, take);
    hash_staged(dst + done, take, hash);
    done += take;
  }
  return Status::ok();
}

}  // namespace fastpersist::checkpoint
