// SPDX-License-Identifier: Apache-2.0
// File-system steps of the writer's commit protocol (private to src/stream).
#pragma once

#include <string>
#include <string_view>

#include "common/unique_fd.h"
#include "fastpersist/layout.h"
#include "fastpersist/status.h"

namespace fastpersist::stream {

// How writers name their temporaries next to "<dir>/<name>": ".<name>" + kTempInfix + six
// mkostemp characters for a single writer, ".<name>" + kPartialSuffix for parallel writers.
// stale_files.cc recognises them by the same constants.
inline constexpr std::string_view kTempInfix = kWriterTempInfix;
inline constexpr size_t kTempRandomChars = 6;
inline constexpr std::string_view kPartialSuffix = kParallelPartialSuffix;

// "<dir>/.<name>.fp-tmp-XXXXXX", created O_EXCL next to `target` (so rename is atomic) and
// flock()ed exclusively through the returned descriptor, which must stay open until the file is
// renamed or unlinked: the lock tells remove_stale_temp_files() that its writer is alive.
Result<UniqueFd> create_temp_beside(const std::string& target, std::string* temp_path);
// fsync of the directory holding `path`, so a rename in it is durable.
Status fsync_parent_dir(const std::string& path);
// rename + (optionally) parent fsync.
Status commit_rename(const std::string& from, const std::string& to, bool durable);
// The directory part and the file-name part of a path ("." for a bare name).
std::string dir_of(const std::string& path);
std::string base_of(const std::string& path);

}  // namespace fastpersist::stream
