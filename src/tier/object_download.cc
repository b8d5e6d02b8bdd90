// SPDX-License-Identifier: Apache-2.0
// Reading checkpoints back from an object tier (object_tier.h): each file in ranged reads of a
// part each, `transfers` at once, written at their offsets; then checked exactly as `verify`
// checks a local checkpoint, before anything is committed.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "checkpoint_dir/checkpoint_fs.h"
#include "common/task_pool.h"
#include "common/unique_fd.h"
#include "fastpersist/checkpoint_commit.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/layout.h"
#include "fastpersist/manifest_index.h"
#include "load/verify_file.h"
#include "tier/object_tier.h"

namespace fastpersist::checkpoint {
namespace {

// Files fetched at once: their ranged reads share the transfers, so small files do not leave
// most transfers idle; bounded so that a checkpoint of many files does not hold as many open.
constexpr size_t kFilesAtOnce = 64;

struct Fetch {
  std::string key;  // the object
  uint64_t size = 0;
  std::string path;  // the new file it becomes
};

// Runs on a fetching thread once file `index` (of the batch's list) is complete (and synced when
// durable), while the other threads go on fetching.
using FileDone = std::function<Status(size_t index)>;

// Each object into its new file: ranges of `part_bytes` from all of them, `transfers` in flight,
// each thread with a buffer of its own.
Status fetch_batch(ObjectStore& store, const std::vector<Fetch>& files,
                   const ObjectTransfer& transfer, bool durable, const FileDone& done_file) {
  std::vector<UniqueFd> fds;
  struct Range {
    size_t file;
    uint64_t offset;
    size_t bytes;
  };
  std::vector<Range> ranges;
  std::unique_ptr<std::atomic<size_t>[]> left(new std::atomic<size_t>[files.size()]);
  for (size_t i = 0; i < files.size(); ++i) {
    const Fetch& f = files[i];
    UniqueFd fd(::open(f.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (!fd.valid())
      return Status::from_errno(errno, "cannot create the downloaded file").with_path(f.path);
    fds.push_back(std::move(fd));
    size_t n = 0;
    for (uint64_t off = 0; off < f.size; off += transfer.part_bytes, ++n) {
      ranges.push_back(
          {i, off, static_cast<size_t>(std::min<uint64_t>(transfer.part_bytes, f.size - off))});
    }
    if (n == 0) ranges.push_back({i, 0, 0});  // an empty file is complete after a no-op range
    left[i] = n == 0 ? 1 : n;
  }
  std::atomic<size_t> next{0};
  std::mutex mu;
  Status first_error;
  auto work = [&] {
    std::vector<std::byte> buffer;
    for (;;) {
      {
        std::lock_guard lock(mu);
        if (!first_error.is_ok()) return;
      }
      const size_t r = next.fetch_add(1);
      if (r >= ranges.size()) return;
      const Range& range = ranges[r];
      const Fetch& f = files[range.file];
      if (buffer.size() < range.bytes) buffer.resize(range.bytes);
      Status st = range.bytes == 0 ? Status::ok()
                                   : store.get(f.key, range.offset,
                                               std::span<std::byte>(buffer.data(), range.bytes));
      if (!st.is_ok()) {
        st = Status(st.code(), "reading " + store.url() + "/" + f.key + ": " + st.message(),
                    st.sys_errno());
      }
      for (size_t done = 0; st.is_ok() && done < range.bytes;) {
        ssize_t w = ::pwrite(fds[range.file].get(), buffer.data() + done, range.bytes - done,
                             static_cast<off_t>(range.offset + done));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
          st = Status::from_errno(w < 0 ? errno : EIO, "writing the downloaded bytes failed")
                   .with_path(f.path)
                   .with_range(range.offset + done, range.bytes - done);
          break;
        }
        done += static_cast<size_t>(w);
      }
      if (st.is_ok() && left[range.file].fetch_sub(1) == 1) {
        // The file's last range: sync and check it now, overlapped with the other fetches.
        if (durable && ::fdatasync(fds[range.file].get()) != 0) {
          st = Status::from_errno(errno, "fdatasync of the downloaded file failed")
                   .with_path(f.path);
        }
        if (st.is_ok() && done_file) st = done_file(range.file);
      }
      if (!st.is_ok()) {
        std::lock_guard lock(mu);
        if (first_error.is_ok()) first_error = st;
        return;
      }
    }
  };
  {
    TaskPool pool(std::min<size_t>(transfer.transfers, std::max<size_t>(ranges.size(), 1)));
    TaskGroup group(pool);
    for (size_t i = 0; i < pool.threads(); ++i) group.run(work);
    group.wait();
  }
  return first_error;
}

// `done_file` gets indices into `files`.
Status fetch_objects(ObjectStore& store, const std::vector<Fetch>& files,
                     const ObjectTransfer& transfer, bool durable, const FileDone& done_file = {}) {
  for (size_t begin = 0; begin < files.size(); begin += kFilesAtOnce) {
    std::vector<Fetch> batch(
        files.begin() + static_cast<std::ptrdiff_t>(begin),
        files.begin() + static_cast<std::ptrdiff_t>(std::min(files.size(), begin + kFilesAtOnce)));
    FileDone done;
    if (done_file) done = [&](size_t i) { return done_file(begin + i); };
    FP_RETURN_IF_ERROR(fetch_batch(store, batch, transfer, durable, done));
  }
  return Status::ok();
}

std::string key_of(const std::string& tag, const ManifestFile& f) {
  return referenced_checkpoint(f).empty() ? tag + "/" + f.name : f.name;
}

}  // namespace

Result<CopyResult> ObjectTier::download(const std::string& tag, CheckpointManager& destination,
                                        IoEngine& check_engine) {
  FP_ASSIGN_OR_RETURN(Manifest m, read_manifest(tag));
  auto begun = destination.begin_commit(tag);
  if (!begun.is_ok()) {
    if (begun.status().code() == StatusCode::kAlreadyExists) return CopyResult{};
    return begun.status();
  }
  std::unique_ptr<CheckpointCommit> commit = std::move(begun).value();
  const std::string dir = commit->directory();
  const ManifestIndex index(m);
  CopyResult result{true, 0};
  std::vector<Fetch> fetches;
  std::vector<size_t> own;
  for (size_t i = 0; i < m.files.size(); ++i) {
    const ManifestFile& f = m.files[i];
    if (!referenced_checkpoint(f).empty()) continue;  // in the base, which the destination holds
    fetches.push_back({key_of(tag, f), f.size, join_path(dir, f.name)});
    own.push_back(i);
    result.bytes += f.size;
  }
  // Each file is checked as soon as it is complete, while the others are still coming, where it
  // now lies, as `verify` would (the bases of XOR deltas are found next to the temporary
  // directory, in the destination's root). Through the page cache, which holds what was just
  // written: a direct read would first wait for it to reach the disk.
  EngineOptions cached_options = check_engine.options();
  cached_options.direct_io = false;
  FP_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> cached, IoEngine::create(cached_options));
  auto check = [&](size_t k) -> Status {
    const size_t i = own[k];
    uint64_t checked = 0;
    FileCheck io{*cached, nullptr, &checked, nullptr, 0, size_t{32} << 20, nullptr, dir};
    std::vector<std::string> problems;
    FP_RETURN_IF_ERROR(
        check_checkpoint_file(fetches[k].path, m, i, index.tensors_in(i), io, problems));
    if (problems.empty()) return Status::ok();
    std::string more =
        problems.size() > 1 ? " (and " + std::to_string(problems.size() - 1) + " more)" : "";
    return Status(StatusCode::kDataLoss, "checkpoint '" + tag + "' in " + url_ +
                                             " is damaged: " + problems.front() + more);
  };
  Status st = check_references_against_bases(dir, m);
  if (st.is_ok())
    st = fetch_objects(*store_, fetches, transfer_, destination.options().durable, check);
  if (!st.is_ok()) {
    (void)commit->abort();
    return st;
  }
  FP_RETURN_IF_ERROR(commit->commit(content_of(std::move(m))));
  return result;
}

Result<VerifyReport> verify_object_checkpoint(ObjectTier& tier, const std::string& tag,
                                              const std::string& scratch, IoEngine& engine) {
  VerifyReport report;
  auto json = tier.read_manifest_bytes(tag);
  if (!json.is_ok()) return json.status();
  auto m = decode_manifest(*json, tier.url() + "/" + tag + "/" + std::string(kManifestFileName));
  if (!m.is_ok()) {
    report.problems.push_back(std::string(kManifestFileName) +
                              " is damaged: " + m.status().to_string());
    return report;
  }
  // A private copy of the checkpoint and of the files it references, laid out as in a root, so
  // that verify_checkpoint checks it exactly as it checks a local one.
  const std::string root = join_path(scratch, ".fp-verify-" + unique_suffix());
  if (::mkdir(root.c_str(), 0700) != 0) {
    return Status::from_errno(errno, "cannot create a scratch folder to verify in").with_path(root);
  }
  struct Cleanup {
    std::string path;
    ~Cleanup() { (void)remove_tree(path); }
  } cleanup{root};
  std::map<std::string, uint64_t> sizes;
  std::vector<std::string> owners{tag};
  for (const std::string& base : referenced_tags(*m)) owners.push_back(base);
  for (const std::string& owner : owners) {
    const std::string d = join_path(root, owner);
    if (::mkdir(d.c_str(), 0700) != 0)
      return Status::from_errno(errno, "cannot create a scratch folder").with_path(d);
    FP_ASSIGN_OR_RETURN(std::vector<ObjectEntry> there, tier.store().list(owner + "/"));
    for (ObjectEntry& e : there) sizes.emplace(std::move(e.key), e.size);
  }
  FP_RETURN_IF_ERROR(
      write_new_file(join_path(join_path(root, tag), kManifestFileName), *json, false));
  // Each base's manifest too: a reference is sound only into a checkpoint the tier committed.
  for (size_t i = 1; i < owners.size(); ++i) {
    auto base_json = tier.read_manifest_bytes(owners[i]);
    if (base_json.is_ok()) {
      FP_RETURN_IF_ERROR(write_new_file(join_path(join_path(root, owners[i]), kManifestFileName),
                                        *base_json, false));
    } else if (base_json.status().code() != StatusCode::kNotFound &&
               base_json.status().code() != StatusCode::kDataLoss) {
      return base_json.status();  // the store failed; a missing or damaged base is the report's
    }
  }
  std::vector<Fetch> fetches;
  for (const ManifestFile& f : m->files) {
    const std::string key = key_of(tag, f);
    auto size = sizes.find(key);
    // A missing object is reported by verify_checkpoint (the file is missing); one of another
    // size is fetched whole, so that it reports the size the store holds.
    if (size != sizes.end()) fetches.push_back({key, size->second, join_path(root, key)});
  }
  Status st = fetch_objects(tier.store(), fetches, tier.transfer(), false);
  if (!st.is_ok()) {
    if (st.code() != StatusCode::kNotFound && st.code() != StatusCode::kDataLoss) return st;
    report.problems.push_back(st.message());  // removed or cut meanwhile
  }
  FP_ASSIGN_OR_RETURN(VerifyReport checked, verify_checkpoint(join_path(root, tag), engine));
  checked.problems.insert(checked.problems.begin(), report.problems.begin(), report.problems.end());
  return checked;
}

}  // namespace fastpersist::checkpoint
