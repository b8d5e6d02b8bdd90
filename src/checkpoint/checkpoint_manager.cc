// SPDX-License-Identifier: Apache-2.0
// CheckpointManager: the lock, the queue of saves and the thread that runs them, failure
// reporting, and retention. The commit protocol itself is in save_job.cc.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "checkpoint/commit_state.h"
#include "checkpoint/pending_save.h"
#include "checkpoint/retention.h"
#include "checkpoint/root_lock.h"
#include "checkpoint/root_scan.h"
#include "checkpoint/save_job.h"
#include "checkpoint/tier_link.h"
#include "checkpoint_dir/checkpoint_fs.h"
#include "common/guarded.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/layout.h"
#include "fastpersist/shard_writer.h"
#include "incremental/incremental.h"
#include "incremental/materialize.h"

namespace fastpersist {

using checkpoint::join_path;

namespace {
Status repair_latest_pointer(const std::string& root, const std::vector<CheckpointInfo>& committed,
                             bool durable);
std::string latest_pointer_tag(const std::string& root);
}  // namespace

struct CheckpointManager::Impl : CommitHost {
  Impl(std::string r, const CheckpointOptions& o) : root(std::move(r)), options(o) {
    commit_link->host = this;
  }

  // CommitHost: what a CheckpointCommit this manager began needs.
  Result<uint64_t> take_sequence() override {
    std::lock_guard lock(mu);
    if (closed)
      return Status(StatusCode::kInvalidArgument, "the CheckpointManager is closed")
          .with_path(root);
    return next_sequence++;
  }
  std::mutex& pointer_mutex() override { return pointer_mu; }
  Status after_commit(const std::string& tag,
                      const std::shared_ptr<const Manifest>& manifest) override {
    {
      std::lock_guard lock(mu);
      note_committed_locked(tag, manifest);
    }
    if (drainer) drainer->committed(tag);
    if (!options.keep_last) return Status::ok();
    auto removed = prune_now(options.keep_last, options.keep_every, tag);
    return removed.is_ok() ? Status::ok() : retention_failure(tag, removed.status());
  }
  void release_tag(const std::string& tag, const std::string& base_tag) override {
    std::lock_guard lock(mu);
    pending_tags.erase(tag);
    if (!base_tag.empty()) bases_in_use.erase(bases_in_use.find(base_tag));
    cv.notify_all();
  }

  static Status retention_failure(const std::string& tag, const Status& st) {
    return Status(st.code(),
                  "checkpoint '" + tag +
                      "' is committed, but removing older ones failed (retried after the next "
                      "save): " +
                      st.message(),
                  st.sys_errno())
        .with_path(st.path());
  }

  // The first failure of a finished save that nobody has reported; forgets finished saves.
  Status take_failure_locked() {
    Status first;
    std::vector<std::shared_ptr<PendingSave::State>> keep;
    for (auto& s : history) {
      Status f = s->take_unreported_failure();
      if (first.is_ok() && !f.is_ok()) first = f;
      bool done;
      {
        std::lock_guard l(s->mu);
        done = s->done;
      }
      if (!done) keep.push_back(s);
    }
    history.swap(keep);
    return first;
  }

  void run() {
    std::unique_lock lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;
      checkpoint::SaveJob job = std::move(queue.front());
      queue.pop_front();
      job.sequence = next_sequence++;
      choose_base_locked(&job);
      lock.unlock();
      job.state->mark_started();
      uint64_t bytes = 0;
      std::shared_ptr<const Manifest> committed;
      Status st = run_guarded("a save", [&] {
        return checkpoint::run_save_job(job, options, *writer, &bytes, &committed);
      });
      {
        std::lock_guard l(mu);
        if (st.is_ok()) note_committed_locked(job.tag, committed);
        if (!job.base_tag.empty()) bases_in_use.erase(bases_in_use.find(job.base_tag));
      }
      if (st.is_ok() && drainer) drainer->committed(job.tag);  // pinned before retention runs
      Status retention;
      if (st.is_ok() && options.keep_last) {
        auto removed = prune_now(options.keep_last, options.keep_every, job.tag);
        if (!removed.is_ok()) retention = retention_failure(job.tag, removed.status());
      }
      // Release the caller's references to the source memory only when nothing reads it.
      job.content.tensors.clear();
      lock.lock();
      // Finished under the manager's lock (order: mu, then the state's mu), so whoever sees the
      // save done also sees its tag no longer pending: remove(tag) or a new save of the tag
      // right after wait() is not refused as "being saved".
      job.state->finish(std::move(st), bytes, std::move(retention));
      --pending;
      pending_tags.erase(job.tag);
      cv.notify_all();
    }
  }

  // Incremental saves: the base the next save compares against, unless full_every says this
  // one is full or the base has gone (removed while nothing referenced it). The base stays in
  // use, so not removable, until the save ends (the caller erases it from bases_in_use).
  std::shared_ptr<const Manifest> choose_base_locked(std::string* tag) {
    if (!options.incremental) return nullptr;
    if (!base.manifest || saves_since_base + 1 >= options.full_every) return nullptr;
    struct stat st {};
    std::string manifest = join_path(join_path(root, base.tag), kManifestFileName);
    if (::lstat(manifest.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      base = {};
      return nullptr;
    }
    *tag = base.tag;
    bases_in_use.insert(base.tag);
    return base.manifest;
  }
  void choose_base_locked(checkpoint::SaveJob* job) {
    job->base = choose_base_locked(&job->base_tag);
    job->base_trusted = base.trusted;
  }

  // Incremental saves: `tag` committed with `manifest` (a save's or a commit's). A full one that
  // recorded digests becomes the base of the next saves; one that references the base counts
  // towards full_every.
  void note_committed_locked(const std::string& tag,
                             const std::shared_ptr<const Manifest>& manifest) {
    if (!options.incremental || !manifest) return;
    const bool references =
        std::any_of(manifest->files.begin(), manifest->files.end(),
                    [](const ManifestFile& f) { return !referenced_checkpoint(f).empty(); });
    if (!references) {
      const bool hashed = std::any_of(manifest->tensors.begin(), manifest->tensors.end(),
                                      [](const ManifestTensor& t) { return t.digest.has_value(); });
      base = hashed ? Base{tag, manifest, true} : Base{};
      saves_since_base = 0;
      return;
    }
    ++saves_since_base;
    // XOR deltas are sized only once written: one larger than half its base says the base has
    // aged, so the next save is full (a fresh base).
    if (options.xor_deltas && base.manifest &&
        2 * checkpoint::own_stored_bytes(*manifest) >
            checkpoint::own_stored_bytes(*base.manifest)) {
      saves_since_base = options.full_every;
    }
  }

  // At open: the base of the newest checkpoint, so incremental saves go on where a previous
  // manager left off (the newest is full and hashed: it is the base; it references a full
  // base: that one, with the saves since it counted). Anything else: the next save is full.
  void find_base(const checkpoint::RootScan& scan) {
    if (!options.incremental || scan.committed.empty()) return;
    const CheckpointInfo& newest = scan.committed.back();
    std::string tag = newest.references.empty()       ? newest.tag
                      : newest.references.size() == 1 ? newest.references.front()
                                                      : "";
    auto it = std::find_if(scan.committed.begin(), scan.committed.end(),
                           [&](const CheckpointInfo& c) { return c.tag == tag; });
    if (it == scan.committed.end() || !it->references.empty()) return;
    auto m = read_manifest(join_path(root, tag));
    if (!m.is_ok()) return;
    bool hashed = std::any_of(m->tensors.begin(), m->tensors.end(),
                              [](const ManifestTensor& t) { return t.digest.has_value(); });
    if (!hashed) return;
    // A referenced tensor keeps the base's checksum: the base must use this manager's kind
    // (checksums on or off), or the new manifest would name the wrong algorithm for it.
    const std::string_view algorithm = options.checksums ? kChecksumAlgorithm : kNoChecksum;
    if (m->checksum_algorithm != algorithm) return;
    base = {tag, std::make_shared<const Manifest>(std::move(m).value()), false};
    saves_since_base = static_cast<unsigned>(
        std::count_if(scan.committed.begin(), scan.committed.end(),
                      [&](const CheckpointInfo& c) { return c.sequence > it->sequence; }));
  }

  // Why `tag` cannot be removed now ("" when it can): a save in progress or the base an
  // incremental save is comparing against (under mu).
  std::string busy_reason_locked(const std::string& tag) const {
    if (pending_tags.count(tag) != 0)
      return "checkpoint '" + tag + "' is being saved; wait for it first";
    if (bases_in_use.count(tag) != 0) {
      return "checkpoint '" + tag +
             "' is the base of an incremental save in progress; wait for it first";
    }
    return drainer ? drainer->pin_reason(tag) : "";
  }

  Status remove_now(const std::string& tag) {
    FP_RETURN_IF_ERROR(validate_tag(tag));
    std::string dir = join_path(root, tag);
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return Status(StatusCode::kNotFound, "no checkpoint '" + tag + "'", ENOENT).with_path(dir);
    }
    std::string trash =
        join_path(root, std::string(kTrashDirPrefix) + tag + "-" + checkpoint::unique_suffix());
    // Renamed first, so the tag vanishes at once and a half-removed tree is never listed.
    if (::rename(dir.c_str(), trash.c_str()) != 0) {
      return Status::from_errno(errno, "cannot move checkpoint '" + tag + "' aside to remove it")
          .with_path(dir);
    }
    if (options.durable) FP_RETURN_IF_ERROR(checkpoint::fsync_dir(root));
    Status repointed = repoint_latest_after_removal({tag});
    Status removed = checkpoint::remove_tree(trash);
    return repointed.is_ok() ? removed : repointed;
  }

  // remove(tag) of a checkpoint that others reference: they would stop loading.
  Status refuse_removing_base(const std::string& tag) {
    FP_ASSIGN_OR_RETURN(checkpoint::RootScan scan, checkpoint::scan_root(root));
    std::vector<std::string> users = checkpoint::referencing(scan, tag);
    if (users.empty()) return Status::ok();
    std::string names;
    for (const std::string& u : users) names += (names.empty() ? "" : ", ") + u;
    return Status(StatusCode::kInvalidArgument,
                  "checkpoint '" + tag + "' is the base of incremental checkpoint(s) " + names +
                      ", which reference its files: remove them first, or make them standalone "
                      "with `fastpersist convert --materialize`")
        .with_path(join_path(root, tag));
  }

  // After `removed` left the root: if `latest` named one of them, it names the newest remaining
  // checkpoint again, or is removed when none remains, so it lags only after a crash (which the
  // next open repairs). Under pointer_mu, so a save committing meanwhile is never pointed back.
  Status repoint_latest_after_removal(const std::vector<std::string>& removed) {
    std::lock_guard pointer_lock(pointer_mu);
    std::string named = latest_pointer_tag(root);
    if (named.empty() || std::find(removed.begin(), removed.end(), named) == removed.end()) {
      return Status::ok();
    }
    FP_ASSIGN_OR_RETURN(checkpoint::RootScan scan, checkpoint::scan_root(root));
    if (!scan.committed.empty())
      return repair_latest_pointer(root, scan.committed, options.durable);
    std::string path = join_path(root, kLatestFileName);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return Status::from_errno(errno, "cannot remove the 'latest' pointer").with_path(path);
    }
    return options.durable ? checkpoint::fsync_dir(root) : Status::ok();
  }

  // Removes what the policy selects; `keep_tag` (the one just committed) is never removed.
  Result<std::vector<std::string>> prune_now(std::optional<unsigned> keep_last,
                                             std::optional<int64_t> keep_every,
                                             const std::string& keep_tag, bool verify = false,
                                             std::vector<std::string>* damaged_found = nullptr) {
    // One retention at a time: the save thread, the drainer and the caller's prune() or
    // remove() would otherwise race to remove the same checkpoint.
    std::lock_guard retention_lock(retention_mu);
    FP_ASSIGN_OR_RETURN(checkpoint::RootScan scan, checkpoint::scan_root(root));
    if (options.retention_by_creation) {
      std::stable_sort(scan.committed.begin(), scan.committed.end(),
                       [](const CheckpointInfo& a, const CheckpointInfo& b) {
                         return a.created_unix < b.created_unix;
                       });
    }
    if (verify && keep_last) {
      std::vector<std::string> found = checkpoint::demote_damaged(&scan, *keep_last, root, *engine);
      if (damaged_found != nullptr) *damaged_found = std::move(found);
    }
    // The policy lists a checkpoint after every one that references it. One that stays anyway
    // (just committed, busy: being saved, drained or waiting for a tier, or failing to go)
    // keeps the checkpoints it references: removing its base would damage it.
    std::unordered_set<std::string> referenced_by_staying;
    // A save still in flight whose directory is already in place is not counted among the
    // newest: its commit may yet be undone (a 'latest' pointer that cannot be written), and
    // an older checkpoint would have gone in its place. It stays, with what it references.
    {
      std::lock_guard l(mu);
      auto in_flight = [&](const CheckpointInfo& c) {
        return c.tag != keep_tag && pending_tags.count(c.tag) != 0;
      };
      for (const CheckpointInfo& c : scan.committed) {
        if (in_flight(c)) referenced_by_staying.insert(c.references.begin(), c.references.end());
      }
      std::erase_if(scan.committed, in_flight);
      // A save that ended during the scan is final now (saves end under `mu`): one whose commit
      // was undone after the scan saw its directory is gone, and must not count either.
      auto undone = [&](const CheckpointInfo& c) {
        struct stat st {};
        return c.tag != keep_tag &&
               ::lstat(join_path(join_path(root, c.tag), kManifestFileName).c_str(), &st) != 0;
      };
      std::erase_if(scan.committed, undone);
    }
    std::unordered_map<std::string, const std::vector<std::string>*> references;
    for (const CheckpointInfo& c : scan.committed) references.emplace(c.tag, &c.references);
    for (const checkpoint::DamagedCheckpoint& d : scan.damaged)
      references.emplace(d.tag, &d.references);
    auto stays = [&](const std::string& tag) {
      auto it = references.find(tag);
      if (it != references.end())
        referenced_by_staying.insert(it->second->begin(), it->second->end());
    };
    std::vector<std::string> removed;
    Status first_error;
    size_t failed = 0;
    for (const std::string& tag : checkpoint::select_all_for_removal(scan, keep_last, keep_every)) {
      if (referenced_by_staying.count(tag) != 0) {
        stays(tag);
        continue;
      }
      if (tag == keep_tag) {
        stays(tag);
        continue;
      }
      {
        std::lock_guard l(mu);
        if (!busy_reason_locked(tag).empty()) {
          stays(tag);
          continue;
        }
      }
      // One checkpoint that cannot be removed does not keep the others (only its bases).
      if (Status st = remove_now(tag); !st.is_ok()) {
        if (first_error.is_ok()) first_error = std::move(st);
        ++failed;
        stays(tag);
        continue;
      }
      removed.push_back(tag);
    }
    if (!first_error.is_ok()) {
      std::string others;
      for (const std::string& tag : removed) others += (others.empty() ? "" : ", ") + tag;
      return Status(first_error.code(),
                    std::to_string(failed) + " old checkpoint(s) could not be removed" +
                        (others.empty() ? "" : " (removed: " + others + ")") +
                        "; first: " + first_error.message(),
                    first_error.sys_errno())
          .with_path(first_error.path());
    }
    return removed;
  }

  const std::string root;
  const CheckpointOptions options;
  std::shared_ptr<IoEngine> engine;
  // The one write path, kept for the manager's lifetime so its staging memory is reused by
  // every save.
  std::unique_ptr<ShardWriter> writer;
  checkpoint::RootLock root_lock;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<checkpoint::SaveJob> queue;
  size_t pending = 0;  // queued + running
  std::set<std::string> pending_tags;
  std::vector<std::shared_ptr<PendingSave::State>> history;  // outcomes not yet collected
  uint64_t next_sequence = 1;
  // Incremental checkpoints: the last full checkpoint, the saves since it (worker thread and
  // open(), under mu), and the base the running save references (removals refuse it).
  struct Base {
    std::string tag;
    std::shared_ptr<const Manifest> manifest;
    bool trusted = false;  // committed by this manager (else found at open: checked before reuse)
  } base;
  unsigned saves_since_base = 0;
  std::multiset<std::string> bases_in_use;  // bases of the saves and commits in progress
  bool stop = false;
  bool closed = false;
  std::mutex close_mu;  // serializes close(); taken before mu
  // Serializes updates of <root>/latest: a save's commit and pointer update (SaveJob::pointer_mu)
  // and the repointing after a removal. Never held while taking mu.
  std::mutex pointer_mu;
  // Serializes retention and removal (prune_now, remove()); taken before mu, never under it.
  std::mutex retention_mu;
  std::thread worker;
  // How the commits this manager began reach it; cleared when the manager is destroyed.
  std::shared_ptr<CommitLink> commit_link = std::make_shared<CommitLink>();
  // The save policy's clock: the last save_async (or open), and the last step should_save
  // said yes to (under mu).
  std::chrono::steady_clock::time_point last_save = std::chrono::steady_clock::now();
  std::optional<int64_t> last_due_step;
  // Saves whose snapshot is not over (PendingSave::State::snapshots_running): the caller is
  // blocked on them, so the drainer pauses its copying meanwhile.
  std::atomic<int> snapshots_running{0};
  // Tiers: what copies committed checkpoints there (tier_link.h; null without tiers). Last, so
  // it stops before what its retention hook uses goes away.
  std::unique_ptr<checkpoint::TierLink> drainer;
};

namespace {

// Removes what crashed saves and removals left behind. Only the lock holder may do this.
Status clean_debris(const std::string& root) {
  FP_ASSIGN_OR_RETURN(auto names, checkpoint::list_dir(root));
  for (const std::string& name : names) {
    bool debris = name.rfind(kTempDirPrefix, 0) == 0 || name.rfind(kTrashDirPrefix, 0) == 0 ||
                  name.rfind(replace_temp_prefix(kLatestFileName), 0) == 0;
    if (debris) FP_RETURN_IF_ERROR(checkpoint::remove_tree(join_path(root, name)));
  }
  return Status::ok();
}

// A crash between a commit and the pointer's update leaves `latest` naming an older checkpoint
// (or a removed one); the lock holder puts it right.
Status repair_latest_pointer(const std::string& root, const std::vector<CheckpointInfo>& committed,
                             bool durable) {
  if (committed.empty()) return Status::ok();
  std::string path = join_path(root, kLatestFileName);
  std::string want = committed.back().tag + "\n";
  auto have = checkpoint::read_small_file(path, 4096);
  if (have.is_ok() && *have == want) return Status::ok();
  // A pointer to a checkpoint another tool wrote into the same root (a directory without a
  // manifest, e.g. a tag of DeepSpeed's own checkpoint engine saved after ours) is that tool's
  // newest checkpoint, not a crash's leftover: it stays.
  if (std::string named = latest_pointer_tag(root); !named.empty() && validate_tag(named).is_ok()) {
    struct stat st;
    std::string dir = join_path(root, named);
    if (::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) &&
        ::stat(join_path(dir, kManifestFileName).c_str(), &st) != 0 && errno == ENOENT) {
      return Status::ok();
    }
  }
  return checkpoint::replace_file_atomically(path, want, durable);
}

// The tag `latest` names, or "" when there is no (readable) pointer.
std::string latest_pointer_tag(const std::string& root) {
  auto text = checkpoint::read_small_file(join_path(root, kLatestFileName), 4096);
  if (!text.is_ok()) return "";
  std::string tag = std::move(text).value();
  while (!tag.empty() && (tag.back() == '\n' || tag.back() == '\r')) tag.pop_back();
  return tag;
}

// mkdir -p of the root. When durable, each directory created is made durable in its parent
// (fsync of the parent), so that a power cut after the first acknowledged save cannot take the
// whole new root with it (the power-loss test of a tier, a root created by its drain, found it).
Status create_root(const std::string& root, bool durable) {
  namespace fs = std::filesystem;
  std::vector<fs::path> missing;
  std::error_code ec;
  for (fs::path p = fs::absolute(root, ec); !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    missing.push_back(p);
    if (p == p.parent_path()) break;
  }
  std::error_code mkdir_error;
  fs::create_directories(root, mkdir_error);  // parents too, like `mkdir -p`
  if (mkdir_error) {
    return Status::from_errno(mkdir_error.value(), "cannot create the checkpoint root")
        .with_path(root);
  }
  if (!durable) return Status::ok();
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    FP_RETURN_IF_ERROR(checkpoint::fsync_dir(it->parent_path().string()));
  }
  return Status::ok();
}

}  // namespace

namespace checkpoint {

// Makes managers for open_manager (the constructor is private to it).
class ManagerAccess {
 public:
  static std::unique_ptr<CheckpointManager> make(std::unique_ptr<CheckpointManager::Impl> impl) {
    return std::unique_ptr<CheckpointManager>(new CheckpointManager(std::move(impl)));
  }
};

Result<std::unique_ptr<CheckpointManager>> open_manager(const std::string& root,
                                                        const CheckpointOptions& options,
                                                        const TierLinkFactory& make_link) {
  using Impl = CheckpointManager::Impl;
  if (root.empty()) return Status(StatusCode::kInvalidArgument, "checkpoint root is empty");
  FP_RETURN_IF_ERROR(options.validate());
  CheckpointOptions effective = options;
  effective.staging_window_bytes = options.effective_window_bytes();
  FP_RETURN_IF_ERROR(create_root(root, options.durable));
  struct stat st {};
  if (::stat(root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Status(StatusCode::kInvalidArgument, "checkpoint root is not a directory")
        .with_path(root);
  }
  auto impl = std::make_unique<Impl>(root, effective);
  FP_ASSIGN_OR_RETURN(impl->root_lock, checkpoint::RootLock::acquire(root));
  FP_RETURN_IF_ERROR(clean_debris(root));
  FP_ASSIGN_OR_RETURN(auto engine, IoEngine::create(options.engine));
  impl->engine = std::move(engine);
  ShardWriterOptions writer_options;
  static_cast<DataFileOptions&>(writer_options) = effective;
  writer_options.content_digests = effective.content_digests || effective.incremental;
  FP_ASSIGN_OR_RETURN(impl->writer, ShardWriter::create(writer_options, impl->engine));
  FP_ASSIGN_OR_RETURN(checkpoint::RootScan scan, checkpoint::scan_root(root));
  // Above every sequence on disk, damaged checkpoints' too, so commit order stays unambiguous
  // even if one of them is repaired later.
  // decode_manifest bounds every sequence by kMaxManifestSequence, so this cannot wrap.
  impl->next_sequence = scan.highest_sequence() + 1;
  impl->find_base(scan);
  FP_RETURN_IF_ERROR(repair_latest_pointer(root, scan.committed, options.durable));
  Impl* raw = impl.get();
  if (!effective.tiers.empty()) {
    if (!make_link) {
      return Status(StatusCode::kInvalidArgument, "this build of the library has no tiers");
    }
    checkpoint::TierLinkSetup setup;
    setup.local_root = root;
    setup.tiers = effective.tiers;
    setup.base = effective;
    setup.pin_until_drained = effective.pin_until_drained;
    setup.pause = [raw] { return raw->snapshots_running.load() > 0; };
    setup.after_drain = [raw]() -> Status {
      if (!raw->options.keep_last) return Status::ok();
      auto removed = raw->prune_now(raw->options.keep_last, raw->options.keep_every, "");
      if (removed.is_ok()) return Status::ok();
      return Status(removed.status().code(),
                    "removing old local checkpoints after a drain failed: " +
                        removed.status().message(),
                    removed.status().sys_errno())
          .with_path(removed.status().path());
    };
    FP_ASSIGN_OR_RETURN(impl->drainer, make_link(std::move(setup)));
  }
  impl->worker = std::thread([raw] { raw->run(); });
  return ManagerAccess::make(std::move(impl));
}

}  // namespace checkpoint

CheckpointManager::CheckpointManager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CheckpointManager::~CheckpointManager() {
  Status st = close();
  {
    std::lock_guard link(impl_->commit_link->mu);
    impl_->commit_link->host = nullptr;
  }
  if (!st.is_ok()) {
    // Nobody is left to report it to: say it rather than lose it.
    std::fprintf(stderr, "fastpersist: a checkpoint save failed and was never reported: %s\n",
                 st.to_string().c_str());
  }
}

Result<PendingSave> CheckpointManager::save_async(const std::string& tag,
                                                  CheckpointContent content) {
  FP_RETURN_IF_ERROR(validate_tag(tag));
  FP_ASSIGN_OR_RETURN(ShardPlan plan, checkpoint::plan_content(content, *impl_->writer));
  Impl& m = *impl_;
  std::unique_lock lock(m.mu);
  if (m.closed)
    return Status(StatusCode::kInvalidArgument, "the CheckpointManager is closed")
        .with_path(m.root);
  FP_RETURN_IF_ERROR(m.take_failure_locked());
  m.cv.wait(lock, [&] { return m.closed || m.pending < m.options.max_in_flight; });
  if (m.closed)
    return Status(StatusCode::kInvalidArgument, "the CheckpointManager is closed")
        .with_path(m.root);
  FP_RETURN_IF_ERROR(m.take_failure_locked());  // an earlier save may have failed meanwhile
  std::string dir = join_path(m.root, tag);
  struct stat st {};
  if (m.pending_tags.count(tag) != 0 || ::lstat(dir.c_str(), &st) == 0) {
    return Status(StatusCode::kAlreadyExists,
                  "checkpoint '" + tag + "' already exists; choose another tag or remove it",
                  EEXIST)
        .with_path(dir);
  }
  m.last_save = std::chrono::steady_clock::now();
  auto state = std::make_shared<PendingSave::State>(tag);
  state->snapshots_running = &m.snapshots_running;
  m.snapshots_running.fetch_add(1);  // until its snapshot ends: drains pause meanwhile
  if (m.drainer) state->tier_errors = m.drainer->take_new_errors();
  checkpoint::SaveJob job;
  job.root = m.root;
  job.tag = tag;
  job.content = std::move(content);
  job.plan = std::move(plan);
  job.state = state;
  job.pointer_mu = &m.pointer_mu;
  m.queue.push_back(std::move(job));
  m.pending_tags.insert(tag);
  ++m.pending;
  m.history.push_back(state);
  m.cv.notify_all();
  return PendingSave(state);
}

Result<std::unique_ptr<CheckpointCommit>> CheckpointManager::begin_commit(const std::string& tag) {
  FP_RETURN_IF_ERROR(validate_tag(tag));
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  if (m.closed)
    return Status(StatusCode::kInvalidArgument, "the CheckpointManager is closed")
        .with_path(m.root);
  std::string dir = join_path(m.root, tag);
  struct stat st {};
  if (m.pending_tags.count(tag) != 0 || ::lstat(dir.c_str(), &st) == 0) {
    return Status(StatusCode::kAlreadyExists,
                  "checkpoint '" + tag +
                      "' already exists or is being saved; choose another tag or remove it",
                  EEXIST)
        .with_path(dir);
  }
  auto state = std::make_unique<CheckpointCommit::State>();
  state->root = m.root;
  state->tag = tag;
  state->directory =
      join_path(m.root, std::string(kTempDirPrefix) + tag + "-" + checkpoint::unique_suffix());
  state->durable = m.options.durable;
  state->manager = m.commit_link;
  if (::mkdir(state->directory.c_str(), 0755) != 0) {
    return Status::from_errno(errno, "cannot create the checkpoint's temporary directory")
        .with_path(state->directory);
  }
  m.pending_tags.insert(tag);
  (void)m.choose_base_locked(&state->base_tag);  // released by release_tag
  return std::make_unique<CheckpointCommit>(std::move(state));
}

Status CheckpointManager::save(const std::string& tag, CheckpointContent content) {
  FP_ASSIGN_OR_RETURN(PendingSave pending, save_async(tag, std::move(content)));
  return pending.wait();
}

Status CheckpointManager::wait_all() {
  Impl& m = *impl_;
  std::unique_lock lock(m.mu);
  m.cv.wait(lock, [&] { return m.pending == 0; });
  return m.take_failure_locked();
}

Status CheckpointManager::wait_snapshots() {
  std::vector<std::shared_ptr<PendingSave::State>> states;
  {
    std::lock_guard lock(impl_->mu);
    states = impl_->history;
  }
  Status first;
  for (auto& s : states) {
    Status st = PendingSave(s).wait_snapshot();
    if (first.is_ok() && !st.is_ok()) first = st;
  }
  return first;
}

Status CheckpointManager::close(std::optional<double> drain_timeout_seconds) {
  Impl& m = *impl_;
  // One close at a time: concurrent closers would join the worker and release the root's lock
  // twice (a second join hangs or throws). Later closers find `closed` and only report.
  std::lock_guard closing(m.close_mu);
  {
    std::lock_guard lock(m.mu);
    if (m.closed) return m.take_failure_locked();
  }
  Status st = wait_all();
  if (m.drainer) {
    Status drained = m.drainer->wait(drain_timeout_seconds);
    m.drainer->stop();  // before the lock goes: its retention hook removes local checkpoints
    if (st.is_ok()) st = drained;
  }
  {
    std::lock_guard lock(m.mu);
    m.closed = true;
    m.stop = true;
    m.cv.notify_all();
  }
  if (m.worker.joinable()) m.worker.join();
  m.root_lock.release();
  m.writer->release_staging();
  return st;
}

Result<bool> CheckpointManager::should_save(int64_t step) {
  const SavePolicy& policy = impl_->options.save_policy;
  if (policy.empty()) {
    return Status(
        StatusCode::kInvalidArgument,
        "no save policy: open the manager with save_every_steps and/or save_every_seconds");
  }
  std::lock_guard lock(impl_->mu);
  if (impl_->last_due_step == step) return false;
  bool due = policy.every_steps && step % *policy.every_steps == 0;
  if (!due && policy.every_seconds) {
    double since =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - impl_->last_save).count();
    due = since >= *policy.every_seconds;
  }
  if (due) impl_->last_due_step = step;
  return due;
}

Status CheckpointManager::wait_drains(std::optional<double> timeout_seconds) {
  if (!impl_->drainer) return Status::ok();
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->closed)
      return Status(StatusCode::kInvalidArgument, "the CheckpointManager is closed");
  }
  return impl_->drainer->wait(timeout_seconds);
}

std::vector<TierState> CheckpointManager::tier_states() const {
  return impl_->drainer ? impl_->drainer->states() : std::vector<TierState>{};  // no tiers
}

Result<std::vector<CheckpointPlace>> CheckpointManager::locations(
    std::vector<std::string>* unreachable) const {
  // The local root must be readable; tiers that are not are named in `unreachable`.
  FP_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> local, list_checkpoints(impl_->root));
  if (impl_->drainer) return impl_->drainer->locations(local, unreachable);
  std::vector<CheckpointPlace> places;
  for (CheckpointInfo& c : local) places.push_back({std::move(c), {impl_->root}, true});
  std::stable_sort(places.begin(), places.end(),  // by creation time, as with tiers
                   [](const CheckpointPlace& a, const CheckpointPlace& b) {
                     return a.info.created_unix < b.info.created_unix;
                   });
  return places;
}

Result<uint64_t> CheckpointManager::pull(const std::string& tier_path, const std::string& tag) {
  const auto& tiers = impl_->options.tiers;
  auto tier = std::find_if(tiers.begin(), tiers.end(),
                           [&](const TierOptions& t) { return t.path == tier_path; });
  if (tier == tiers.end()) {
    return Status(StatusCode::kInvalidArgument,
                  "'" + tier_path + "' is not one of this manager's tiers");
  }
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->closed)
      return Status(StatusCode::kInvalidArgument, "the CheckpointManager is closed");
  }
  return impl_->drainer->pull(*tier, tag, *impl_->engine, *this);
}

const std::string& CheckpointManager::root() const { return impl_->root; }
const CheckpointOptions& CheckpointManager::options() const { return impl_->options; }
IoEngine& CheckpointManager::engine() { return *impl_->engine; }
size_t CheckpointManager::staging_bytes() const { return impl_->writer->staging_bytes(); }

Result<std::vector<CheckpointInfo>> CheckpointManager::list() const {
  return list_checkpoints(impl_->root);
}

Status CheckpointManager::remove(const std::string& tag) {
  FP_RETURN_IF_ERROR(validate_tag(tag));
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->closed)
      return Status(StatusCode::kInvalidArgument, "the CheckpointManager is closed");
    if (std::string busy = impl_->busy_reason_locked(tag); !busy.empty()) {
      return Status(StatusCode::kBusy, busy);
    }
  }
  std::lock_guard retention_lock(impl_->retention_mu);
  {
    // Checked again under the retention lock: the drainer may have pinned it meanwhile.
    std::lock_guard lock(impl_->mu);
    if (std::string busy = impl_->busy_reason_locked(tag); !busy.empty())
      return Status(StatusCode::kBusy, busy);
  }
  FP_RETURN_IF_ERROR(impl_->refuse_removing_base(tag));
  return impl_->remove_now(tag);
}

Result<uint64_t> CheckpointManager::materialize(const std::string& tag) {
  FP_RETURN_IF_ERROR(validate_tag(tag));
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->closed)
      return Status(StatusCode::kInvalidArgument, "the CheckpointManager is closed");
    if (std::string busy = impl_->busy_reason_locked(tag); !busy.empty()) {
      return Status(StatusCode::kBusy, busy);
    }
  }
  return checkpoint::materialize_checkpoint(impl_->root, tag, impl_->options.durable);
}

Result<std::vector<std::string>> CheckpointManager::prune(std::optional<unsigned> keep_last,
                                                          std::optional<int64_t> keep_every,
                                                          bool verify,
                                                          std::vector<std::string>* damaged_found) {
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->closed)
      return Status(StatusCode::kInvalidArgument, "the CheckpointManager is closed");
  }
  return impl_->prune_now(keep_last, keep_every, "", verify, damaged_found);
}

}  // namespace fastpersist
