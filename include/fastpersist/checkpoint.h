// SPDX-License-Identifier: Apache-2.0
// CheckpointManager: durable, verified, asynchronous checkpoints under one root directory.
//
//   <root>/
//     .lock                         flock()ed by the one manager that may write here
//     latest                        the newest committed tag (text), replaced by rename
//     <tag>/manifest.json           written last: names every file and tensor, with checksums
//     <tag>/tensors-00000-of-00002.safetensors, ...   data, 4096-aligned, valid safetensors
//     <tag>/objects.pkl             the non-tensor part of the state (opaque bytes here)
//     .tmp-<tag>-<unique>/          a save in progress (garbage after a crash, removed on open)
//
// Commit protocol (docs/commit_protocol.md; implemented in save_job.cc):
//   1. mkdir <root>/.tmp-<tag>-<unique>/;
//   2. write every data file there (O_DIRECT, checksummed while staged), fdatasync each;
//   3. write objects.pkl, then manifest.json last; fsync both and the directory;
//   4. rename the directory to <root>/<tag>; fsync <root>;
//   5. write <root>/.latest.tmp, fsync, rename to <root>/latest, fsync <root>;
//   6. retention: older checkpoints beyond keep_last are renamed to .trash-* and removed.
// A crash before 4 leaves only a .tmp-* directory (never listed, removed by the next manager);
// after 4 the checkpoint is complete. latest_checkpoint() is the newest complete one by commit
// order; the `latest` file (for other tools) may lag after a crash until the next manager opens
// the root and repairs it. A save that fails after step 4 undoes it, so an error always means
// "not committed". A failure in step 6 does not fail the save: PendingSave::retention_status()
// reports it, and the next save's retention retries.
//
// Step 2 is the manager's ShardWriter (shard_writer.h), the same write path a rank uses.
//
// Saving is asynchronous inside: save_async() returns once the request is queued; a background
// thread snapshots the tensors into pinned staging memory (reusable across saves, bounded by
// staging_budget_bytes), writes and commits. The caller must not modify the tensors' memory
// until PendingSave::snapshot_done(); after that it may do anything. A failure is reported by
// PendingSave::wait() and, if nobody collected it, by the next save, save_async, wait_all or
// close of the manager: it never vanishes.
//
// Thread-safety: all CheckpointManager and PendingSave methods may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fastpersist/checkpoint_commit.h"
#include "fastpersist/io_engine.h"
#include "fastpersist/manifest.h"
#include "fastpersist/options.h"
#include "fastpersist/save_policy.h"
#include "fastpersist/shard_writer.h"
#include "fastpersist/status.h"
#include "fastpersist/tensor_source.h"
#include "fastpersist/tier.h"

namespace fastpersist {

// Everything one checkpoint holds.
namespace checkpoint {
class ManagerAccess;  // the library's own way to construct managers (src/checkpoint/tier_link.h)
}  // namespace checkpoint

struct CheckpointContent {
  std::vector<TensorSource> tensors;
  std::map<std::string, std::string> aliases;  // name -> stored tensor name (shared memory)
  std::string objects;                         // the sidecar's bytes (pickled non-tensor state)
  std::optional<int64_t> step;
  std::string metadata_json = "{}";             // user metadata, a JSON object
  std::map<std::string, std::string> versions;  // added to {"fastpersist": <version>}
};

// The data-file settings (engine, staging, file sizes, durable, checksums) are the ShardWriter's
// (DataFileOptions, shard_writer.h): every save goes through the manager's one ShardWriter.
// Without checksums the manifest says checksum_algorithm "none": loads and verify then check
// sizes and headers only.
struct CheckpointOptions : DataFileOptions {
  unsigned max_in_flight = 1;         // saves queued or running; one more waits
  std::optional<unsigned> keep_last;  // retention: the newest N committed checkpoints ...
  std::optional<int64_t> keep_every;  // ... plus those whose step is a multiple of K
  // Retention counts "newest" by creation time (each manifest's created_unix, which a copy
  // keeps from its original) instead of by commit order in this root. A tier's manager sets it:
  // copies can arrive out of order there (a base sent again for a newer checkpoint that
  // references it), and one that arrived last is not the newest. Off for a root saved into
  // directly, where commit order is the order that a clock that jumps cannot disturb.
  bool retention_by_creation = false;
  // Incremental checkpoints (docs/incremental.md): every save hashes each host tensor
  // (XXH3-128, recorded in the manifest); a save then stores each tensor whose hash, name,
  // dtype and shape equal the base's as a reference to the base's bytes and writes only the
  // others. The base is the last full checkpoint; a save is full when the base is missing, when
  // full_every saves have passed since it (it counts), or when more than half the bytes changed.
  bool incremental = false;
  unsigned full_every = 10;  // 1: every save is full
  // Incremental saves only: a changed float tensor whose previous version is in the base is
  // stored as the byte-grouped, zstd-compressed XOR with it ("xor-zstd") when its first chunk
  // comes out smaller that way (docs/incremental.md, "XOR deltas"); loads read the base's bytes
  // to undo it. A save then references the base when the bytes it can take from there
  // (unchanged, or a delta) are at least the others; an incremental save that still came out
  // larger than half its base makes the next save full.
  bool xor_deltas = false;
  // Tiers (tier.h, docs/tiers.md): each committed checkpoint a tier selects is copied there in
  // the background. A selected checkpoint stays pinned locally until it is there (retention
  // skips it; remove() is refused); off: only the one being copied is.
  std::vector<TierOptions> tiers = {};
  bool pin_until_drained = true;
  // When should_save(step) says yes (save_policy.h); empty: should_save is refused.
  SavePolicy save_policy = {};

  // Every setting in range, or kInvalidArgument naming the first that is not: the data-file
  // settings (DataFileOptions::validate), the manager's own, the save policy. The tiers are
  // checked with the root, when the manager opens. The one check of these settings: open()
  // runs it, and the Python package runs it when it builds the options.
  Status validate() const;
};

// The state of one save. Shared between the manager's thread and the caller.
// A CheckpointOptions setting by the name its users give it (a keyword of the Python
// CheckpointManager and of the DCP storage writer), the option field it sets (as bound to
// Python) and the kind of value it takes. The one list of those names: the Python option builder
// (_core.CHECKPOINT_SETTINGS) goes by it, and a test holds it to the bound fields. The engine's
// settings are kEngineSettings (options.h); keep_last, keep_every, tiers and pin_until_drained
// are arguments of their own.
struct CheckpointSetting {
  std::string_view name;
  std::string_view field;
  SettingKind kind;
};

inline constexpr CheckpointSetting kCheckpointSettings[] = {
    {"staging_budget", "staging_budget_bytes", SettingKind::kBytes},
    {"staging_window", "staging_window_bytes", SettingKind::kBytes},
    {"target_file_size", "target_file_bytes", SettingKind::kBytes},
    {"min_file_size", "min_file_bytes", SettingKind::kBytes},
    {"max_parallel_files", "max_parallel_files", SettingKind::kCount},
    {"max_in_flight", "max_in_flight", SettingKind::kCount},
    {"compression_threads", "compression_threads", SettingKind::kCount},
    {"full_every", "full_every", SettingKind::kCount},
    {"save_every_steps", "save_every_steps", SettingKind::kCount},
    {"lock_staging_memory", "lock_staging_memory", SettingKind::kFlag},
    {"durable", "durable", SettingKind::kFlag},
    {"checksums", "checksums", SettingKind::kFlag},
    {"incremental", "incremental", SettingKind::kFlag},
    {"xor_deltas", "xor_deltas", SettingKind::kFlag},
    {"compression", "compression", SettingKind::kCodec},
    {"compression_level", "compression_level", SettingKind::kLevel},
    {"save_every_seconds", "save_every_seconds", SettingKind::kSeconds},
};

class PendingSave {
 public:
  struct State;
  explicit PendingSave(std::shared_ptr<State> state) : state_(std::move(state)) {}
  const std::string& tag() const;
  bool snapshot_done() const;  // the caller may now modify the source tensors
  bool done() const;           // committed or failed
  // Blocks until snapshot_done(); returns the failure if the save failed before that.
  Status wait_snapshot() const;
  // Blocks until done(); OK when committed. Marks the outcome as reported.
  Status wait() const;
  // Blocks until done(); true when committed. Leaves the outcome unreported: an observer (an
  // on-commit hook) learns it without taking a failure from whoever calls wait().
  bool wait_done() const;
  // Seconds spent: snapshot (first byte staged to last byte staged), and the whole save.
  double snapshot_seconds() const;
  double total_seconds() const;
  uint64_t bytes() const;  // bytes written (all files)
  // CPU seconds spent computing checksums (all files together; they overlap the writes).
  double checksum_seconds() const;
  // After a committed save with retention (keep_last): OK, or why removing older checkpoints
  // failed. That does not fail the save (the checkpoint is committed and wait() returns OK);
  // retention runs again after the next save.
  Status retention_status() const;
  // Incremental saves (CheckpointOptions::incremental), once done: the tag of the base whose
  // files this checkpoint references ("" for a full checkpoint), and the tensor bytes it took
  // from there without writing them.
  std::string base_tag() const;
  uint64_t referenced_bytes() const;
  // With tiers: the drain failures that happened since the previous save_async (a failed drain
  // never fails a save; it is retried). Known when save_async returns.
  std::vector<Status> tier_errors() const;

 private:
  std::shared_ptr<State> state_;
};

struct CheckpointInfo {
  std::string tag;
  std::optional<int64_t> step;
  uint64_t sequence = 0;
  double created_unix = 0;
  uint64_t tensor_bytes = 0;
  uint64_t total_bytes = 0;  // all files, those it references in other checkpoints included
  uint64_t own_bytes = 0;    // the files in its own directory (what removing it frees)
  size_t num_tensors = 0;
  // The checkpoints whose files this one references (an incremental checkpoint names its base;
  // empty for a full one), in name order. Retention never removes one of them while this one
  // is kept.
  std::vector<std::string> references = {};
};

// One committed checkpoint and every place it lives (CheckpointManager::locations(), tier.h).
struct CheckpointPlace {
  CheckpointInfo info;             // as the first place lists it
  std::vector<std::string> roots;  // the local root first when it is there, then tiers in order
  bool local = false;              // roots.front() is the local root
};

class CheckpointManager {
 public:
  // Creates `root` if needed, takes its lock (kBusy names the holder's pid when another
  // manager has it) and removes the debris of crashed saves (.tmp-*, .trash-*).
  static Result<std::unique_ptr<CheckpointManager>> open(const std::string& root,
                                                         const CheckpointOptions& options = {});
  ~CheckpointManager();  // close()
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  // Queues a save of `content` under `tag` (waiting while max_in_flight saves are pending).
  // Errors returned here: a bad tag or tensor description (kInvalidArgument), a tag that is
  // already committed (kAlreadyExists), the unreported failure of an earlier save, a closed
  // manager. The source memory must stay unchanged until the result's snapshot_done().
  Result<PendingSave> save_async(const std::string& tag, CheckpointContent content);
  // save_async + wait.
  Status save(const std::string& tag, CheckpointContent content);
  // Waits for every pending save; the first unreported failure.
  Status wait_all();
  // Waits for pending snapshots only (what an optimizer hook waits for).
  Status wait_snapshots();
  // Waits for everything, then releases the lock. Idempotent; later saves fail. A
  // CheckpointCommit still open then can only abort. With tiers it waits for the drains too
  // (wait_drains(drain_timeout_seconds)) and returns their failure when nothing else failed;
  // a drain still running at the timeout stops, and the next manager copies that checkpoint.
  Status close(std::optional<double> drain_timeout_seconds = std::nullopt);

  // The save policy (CheckpointOptions::save_policy): whether a save is due at `step`: the step
  // is a multiple of every_steps, or every_seconds passed since the last save_async (or since
  // open). Never twice for one step. kInvalidArgument without a policy.
  Result<bool> should_save(int64_t step);

  // Tiers: waits (at most `timeout_seconds`) until every committed checkpoint a tier selects
  // has been tried once more since this call; OK when each is in its tiers. Otherwise the
  // failures (kBusy naming what is left when the timeout came first). OK at once without tiers.
  Status wait_drains(std::optional<double> timeout_seconds = std::nullopt);
  std::vector<TierState> tier_states() const;  // one per tier, in options().tiers order
  // Every committed checkpoint of the local root and of each tier, oldest first by creation
  // time; copies of one checkpoint (same tag and creation time) are one entry. A tier that
  // cannot be listed is skipped and named in `unreachable` ("path: why").
  Result<std::vector<CheckpointPlace>> locations(
      std::vector<std::string>* unreachable = nullptr) const;
  // Copies checkpoint `tag` of the tier at `tier_path` (one of options().tiers) into the local
  // root, every byte checked on the way, its base first when it is incremental and the base is
  // not local. Returns the bytes copied (0: it was local already). kDataLoss when the tier's
  // copy is damaged; the local root is then as it was.
  Result<uint64_t> pull(const std::string& tier_path, const std::string& tag);

  // Begins a checkpoint that other writers fill (the ranks of a distributed job) and this
  // manager commits (checkpoint_commit.h): creates its temporary directory under the root.
  // kInvalidArgument for a bad tag or a closed manager; kAlreadyExists when the tag is committed
  // or being saved. The tag counts as being saved until the commit or abort.
  Result<std::unique_ptr<CheckpointCommit>> begin_commit(const std::string& tag);

  const std::string& root() const;
  // The options in force: as given, except staging_window_bytes, which a smaller nonzero
  // staging_budget_bytes lowers to the budget (rounded down to 4096).
  const CheckpointOptions& options() const;
  IoEngine& engine();
  // Staging memory allocated now (kept for reuse by later saves; at most the budget).
  size_t staging_bytes() const;

  // Committed checkpoints (see list_checkpoints) and removal. remove() never leaves a
  // half-deleted checkpoint under its tag (rename first); it refuses a tag a pending save uses.
  // When `latest` named the removed checkpoint (remove() or prune()), it is replaced atomically
  // and durably to name the newest remaining one, or removed when none remains.
  Result<std::vector<CheckpointInfo>> list() const;
  Status remove(const std::string& tag);
  // Applies keep_last / keep_every now (save() applies them after each commit). Never removes
  // the newest committed checkpoint. Returns the removed tags.
  // With `verify`, the checkpoints that would be kept as the newest keep_last are first read
  // and checked against their checksums, newest first: one that fails (bit rot) does not count,
  // so an older intact one is kept in its place, and it is itself treated as damaged (kept while
  // it is the newest). `damaged_found` (optional) receives "tag: problem" for each.
  Result<std::vector<std::string>> prune(std::optional<unsigned> keep_last,
                                         std::optional<int64_t> keep_every, bool verify = false,
                                         std::vector<std::string>* damaged_found = nullptr);

  // Makes the incremental checkpoint `tag` standalone (incremental/materialize.h): the base
  // files it references are copied into it and its manifest is replaced atomically, so its base
  // can be removed. Returns the bytes copied (0: it was standalone already). kBusy while a save
  // writes it or is comparing against it.
  Result<uint64_t> materialize(const std::string& tag);

  struct Impl;

 private:
  friend class checkpoint::ManagerAccess;
  explicit CheckpointManager(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Tags are directory names: 1-200 characters of [A-Za-z0-9._-], not starting with '.', and not
// "latest". kInvalidArgument says why not.
Status validate_tag(const std::string& tag);

}  // namespace fastpersist
