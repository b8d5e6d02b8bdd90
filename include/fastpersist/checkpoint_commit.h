// SPDX-License-Identifier: Apache-2.0
// CheckpointCommit: a checkpoint whose files several writers produce (the ranks of a distributed
// job, each with its own ShardWriter, shard_writer.h) and one process commits, with exactly the
// protocol of CheckpointManager's own saves (docs/commit_protocol.md):
//
//   coordinator: commit = manager.begin_commit(tag)       mkdir <root>/.tmp-<tag>-<unique>/
//   every rank:  ShardWriter{rank = r}.write(commit->directory(), ...) -> records
//                write_sidecar_file(commit->directory(), ...)         -> record
//   coordinator: gathers every rank's records (they are plain values), then
//                commit->commit(content)   checks that the directory holds exactly the listed
//                                          files with their sizes, writes manifest.json, fsyncs
//                                          the directory (one fsync makes every rank's entries
//                                          durable), renames it to <root>/<tag>, fsyncs the
//                                          root, replaces `latest`, applies retention.
//                or commit->abort()        removes the directory and everything in it.
//
// Until commit() renames the directory, no tag exists: a crash or failure of any rank, or of the
// coordinator, leaves the root as it was plus a temporary directory that the next manager to open
// the root removes. The manager's root lock is held throughout, so nothing else commits, prunes or
// cleans the root meanwhile.
//
// Thread-safety: one CheckpointCommit is used by one thread at a time; it must not outlive the
// manager that began it (commit() after the manager closed fails with kInvalidArgument).
// write_sidecar_file may be called from any thread or process.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fastpersist/manifest.h"
#include "fastpersist/status.h"

namespace fastpersist {

// What the coordinator commits: every writer's records and the checkpoint's own fields. The
// manager fills in the tag, the commit sequence, the time (unless given), the fingerprint and the
// fastpersist version.
struct CommitContent {
  std::optional<int64_t> step;
  std::string metadata_json = "{}";             // user metadata, a JSON object
  std::map<std::string, std::string> versions;  // added to {"fastpersist": <version>}
  uint32_t world_size = 1;                      // how many ranks wrote the files
  std::vector<ManifestFile> files;              // every file in directory(), once each
  std::vector<ManifestTensor> tensors;          // every stored tensor (or block), once each
  std::map<std::string, std::string> aliases;
  // false: the writers ran without checksums (every checksum 0); the manifest says so.
  bool checksums = true;
  // When the checkpoint was made (seconds since the epoch); nullopt: now. A tier's copy keeps
  // the time of the original, so that copies in several places compare by age.
  std::optional<double> created_unix;
  std::optional<double> blocking_seconds;  // Manifest::blocking_seconds (a copy keeps it)
};

class CheckpointCommit {
 public:
  struct State;
  explicit CheckpointCommit(std::unique_ptr<State> state);
  ~CheckpointCommit();  // abort() unless committed or aborted
  CheckpointCommit(const CheckpointCommit&) = delete;
  CheckpointCommit& operator=(const CheckpointCommit&) = delete;

  const std::string& tag() const;
  // The temporary directory every writer writes into (exists until commit or abort).
  const std::string& directory() const;
  // With CheckpointOptions::incremental, the full checkpoint of the root that the writers may
  // reference (incremental.h: each writes its tensors against it and records references to its
  // files); chosen, and kept from removal, until the commit is over. "" when the checkpoint is
  // to be full (not incremental, no base yet, or full_every reached).
  const std::string& base_tag() const;
  // Whether commit() succeeded or abort() ran: the commit is over either way.
  bool finished() const;

  // Builds the manifest from `content` and commits it (steps in the file comment). On any
  // failure nothing is committed, the directory is removed (as by abort()) and the commit is
  // over: kInvalidArgument when the manifest would not decode (naming the field), the metadata
  // is not a JSON object, or the directory holds a file nobody listed (a writer's records were
  // lost); kDataLoss when a listed file is missing or has another size; kAlreadyExists when the
  // tag was committed meanwhile; kInvalidArgument when the manager was closed. On success the
  // retention of the manager applies (its failure is retention_error(); the checkpoint stays
  // committed). kInvalidArgument when the commit is already over.
  Status commit(CommitContent content);
  // Removes the directory and all it holds; the tag is free again. Idempotent.
  Status abort();
  // Why removing older checkpoints after a successful commit failed (OK otherwise).
  const Status& retention_error() const;

 private:
  std::unique_ptr<State> state_;
};

// Writes `bytes` as the new file <directory>/<name> (created, never replacing one; fdatasynced
// when `durable`) and returns its record: role "objects", its size, the XXH3-64 of the whole file
// (0 without `checksums`), and `rank`. For the small files a writer keeps next to its data files
// (a rank's pickled non-tensor items, a distributed checkpoint's planner metadata). `name` must be
// a plain file name (kInvalidArgument otherwise).
Result<ManifestFile> write_sidecar_file(const std::string& directory, const std::string& name,
                                        std::string_view bytes, bool durable, bool checksums,
                                        std::optional<uint32_t> rank = std::nullopt);

}  // namespace fastpersist
