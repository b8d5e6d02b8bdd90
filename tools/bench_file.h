// SPDX-License-Identifier: Apache-2.0
// File chores around a benchmark run that the engine deliberately does not do: fsync (the engine
// never syncs; a checkpoint writer decides when), page-cache eviction, and clean-up.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "fastpersist/status.h"

namespace fastpersist::cli {

// The size of a regular file, or nullopt when `path` does not exist.
Result<std::optional<uint64_t>> regular_file_size(const std::string& path);
// fsync through a fresh descriptor: fsync is per inode, so this flushes what the engine wrote.
Status fsync_path(const std::string& path);
// Flushes the file and drops its pages from the page cache, so the next read comes from storage.
Status evict_from_page_cache(const std::string& path);
// Removes `path` if it exists and syncs its folder, so a timed write starts from a new file
// (as DeepSpeed's ds_io does) without the cost of freeing the old one inside the timing.
Status remove_file(const std::string& path);
// Non-zero pseudo-random bytes (xorshift64*), so compressing or deduplicating storage cannot
// make the benchmark look faster than it would be with real tensors.
void fill_pseudo_random(std::byte* data, size_t bytes, uint64_t seed);

}  // namespace fastpersist::cli
