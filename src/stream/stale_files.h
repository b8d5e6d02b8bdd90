// SPDX-License-Identifier: Apache-2.0
// Temporary files left by FastFileWriters that died before they committed or aborted (private
// to the library: `fastpersist clean` and Python's clean_stale_temp_files are its entry points).
//
// A FastFileWriter writes into "<dir>/.<name>.fp-tmp-XXXXXX" and holds an exclusive flock on it
// from creation until the rename (or the unlink of abort()). The kernel drops that lock when the
// writer's process dies, however it dies (SIGKILL, OOM killer, power loss before a reboot). So a
// temporary whose lock can be taken has no living writer and can never be committed: it is
// debris. Removing it is safe at any time, even while other writers run in the same directory,
// because the remover deletes a file only while it holds that file's lock, and a writer that
// finds its fresh temporary deleted before it could lock it simply makes another one.
//
// Every FastFileWriter removes the debris of its own target name when it opens, so a job that
// saves to the same path again cleans up after a crash by itself. remove_stale_temp_files()
// (`fastpersist clean DIR`) does it for every target in a directory.
//
// Parallel writers share ".<name>.fp-partial" (plus ".done" and ".lock" records, see
// src/stream/parallel_commit.h), and each holds a shared flock on it while it runs. A set that
// no writer holds any more can still be completed by a rank that has not started yet, so it
// is removed only when it has also not been written for `parallel_set_min_age_seconds`.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fastpersist/status.h"

namespace fastpersist {

struct StaleFileOptions {
  std::string target_name;  // non-empty: only the temporaries of this file name
  bool dry_run = false;     // list what would be removed, remove nothing
  bool parallel_sets = true;
  double parallel_set_min_age_seconds = 3600;
  // Also every directory below `dir` (symlinks are not followed, other filesystems not
  // entered); an unreadable one is listed in `failed`.
  bool recursive = false;
};

struct StaleFileReport {
  std::vector<std::string> removed;  // temporaries of dead writers (would be removed: dry run)
  std::vector<std::string> in_use;   // temporaries a living writer still holds
  std::vector<std::string>
      too_recent;  // parallel sets without writers, younger than the minimum age
  std::vector<std::pair<std::string, std::string>> failed;  // path, why it could not be removed
  uint64_t removed_bytes = 0;
};

// Removes the temporaries of dead writers in `dir` (and below it when `recursive`). Fails only
// when `dir` cannot be read; a file that cannot be removed is listed in `failed`.
Result<StaleFileReport> remove_stale_temp_files(const std::string& dir,
                                                const StaleFileOptions& options = {});

// Whether `name` (a file name, no directory) is a FastFileWriter temporary, and of which target.
bool is_writer_temp_name(const std::string& name, std::string* target_name = nullptr);
// Whether `name` is the shared temporary of parallel writers (".<target>.fp-partial").
bool is_parallel_set_name(const std::string& name, std::string* target_name = nullptr);

}  // namespace fastpersist
