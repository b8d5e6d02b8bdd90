// SPDX-License-Identifier: Apache-2.0
// Reading checkpoints back from an object tier (object_tier.h): each file in ranged reads of a
// part each, `transfers` at once, written at their offsets; then checked exactly as `verify`
// checks a local checkpoint, before anything is committed.
#include <fcntl.h>
#include <unistd.h>

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint_fs.h"
#include "checkpoint/object_tier.h"
#include "checkpoint/verify_file.h"
#include "common/task_pool.h"
#include "common/unique_fd.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/checkpoint_commit.h"
#include "fastpersist/layout.h"
#include "fastpersist/manifest_index.h"

namespace fastpersist::checkpoint {
namespace {

// Object `key` of `size` bytes into the new file `path`: ranges of `part_bytes`, `transfers` in
// flight, each thread with a buffer of its own.
Status fetch_object(ObjectStore& store, const std::string& key, uint64_t size, const std::string& path,
                    const ObjectTransfer& transfer, bool durable) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!fd.valid()) return Status::from_errno(errno, "cannot create the downloaded file").with_path(path);
  const uint64_t parts = (size + transfer.part_bytes - 1) / transfer.part_bytes;
  std::atomic<uint64_t> next{0};
  std::mutex mu;
  Status first_error;
  auto work = [&] {
    std::vector<std::byte> buffer;
    for (;;) {
      {
        std::lock_guard lock(mu);
        if (!first_error.is_ok()) return;
      }
      const uint64_t part = next.fetch_add(1);
      if (part >= parts) return;
      const uint64_t offset = part * transfer.part_bytes;
      const size_t n = static_cast<size_t>(std::min<uint64_t>(transfer.part_bytes, size - offset));
      if (buffer.size() < n) buffer.resize(n);
      Status st = store.get(key, offset, std::span<std::byte>(buffer.data(), n));
      for (size_t done = 0; st.is_ok() && done < n;) {
        ssize_t w = ::pwrite(fd.get(), buffer.data() + done, n - done, static_cast<off_t>(offset + done));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
          st = Status::from_errno(w < 0 ? errno : EIO, "writing the downloaded bytes failed")
                   .with_path(path)
                   .with_range(offset + done, n - done);
          break;
        }
        done += static_cast<size_t>(w);
      }
      if (!st.is_ok()) {
        std::lock_guard lock(mu);
        if (first_error.is_ok()) {
          first_error = Status(st.code(), "reading " + store.url() + "/" + key + ": " + st.message(), st.sys_errno())
                            .with_path(st.path());
        }
        return;
      }
    }
  };
  {
    TaskPool pool(std::min<uint64_t>(transfer.transfers, std::max<uint64_t>(parts, 1)));
    TaskGroup group(pool);
    for (size_t i = 0; i < pool.threads(); ++i) group.run(work);
    group.wait();
  }
  FP_RETURN_IF_ERROR(first_error);
  if (durable && ::fdatasync(fd.get()) != 0) {
    return Status::from_errno(errno, "fdatasync of the downloaded file failed").with_path(path);
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
  Status st;
  for (size_t i = 0; i < m.files.size() && st.is_ok(); ++i) {
    const ManifestFile& f = m.files[i];
    if (!referenced_checkpoint(f).empty()) continue;  // in the base, which the destination holds
    const std::string path = join_path(dir, f.name);
    st = fetch_object(*store_, key_of(tag, f), f.size, path, transfer_, destination.options().durable);
    if (!st.is_ok()) break;
    result.bytes += f.size;
    // Checked where it now lies, as `verify` would (the bases of XOR deltas are found next to
    // the temporary directory, in the destination's root).
    uint64_t checked = 0;
    FileCheck io{check_engine, nullptr, &checked, nullptr, 0, size_t{32} << 20, nullptr, dir};
    std::vector<std::string> problems;
    st = check_checkpoint_file(path, m, i, index.tensors_in(i), io, problems);
    if (st.is_ok() && !problems.empty()) {
      std::string more = problems.size() > 1 ? " (and " + std::to_string(problems.size() - 1) + " more)" : "";
      st = Status(StatusCode::kDataLoss, "checkpoint '" + tag + "' in " + url_ + " is damaged: " + problems.front() + more);
    }
  }
  if (!st.is_ok()) {
    (void)commit->abort();
    return st;
  }
  FP_RETURN_IF_ERROR(commit->commit(content_of(std::move(m))));
  return result;
}

Result<VerifyReport> verify_object_checkpoint(ObjectTier& tier, const std::string& tag, const std::string& scratch,
                                              IoEngine& engine) {
  VerifyReport report;
  auto json = tier.read_manifest_bytes(tag);
  if (!json.is_ok()) return json.status();
  auto m = decode_manifest(*json, tier.url() + "/" + tag + "/" + std::string(kManifestFileName));
  if (!m.is_ok()) {
    report.problems.push_back(std::string(kManifestFileName) + " is damaged: " + m.status().to_string());
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
    if (::mkdir(d.c_str(), 0700) != 0) return Status::from_errno(errno, "cannot create a scratch folder").with_path(d);
    FP_ASSIGN_OR_RETURN(std::vector<ObjectEntry> there, tier.store().list(owner + "/"));
    for (ObjectEntry& e : there) sizes.emplace(std::move(e.key), e.size);
  }
  FP_RETURN_IF_ERROR(write_new_file(join_path(join_path(root, tag), kManifestFileName), *json, false));
  for (const ManifestFile& f : m->files) {
    const std::string key = key_of(tag, f);
    auto size = sizes.find(key);
    // A missing object is reported by verify_checkpoint (the file is missing); one of another
    // size is fetched whole, so that it reports the size the store holds.
    if (size == sizes.end()) continue;
    Status st = fetch_object(tier.store(), key, size->second, join_path(root, key), tier.transfer(), false);
    if (st.is_ok()) continue;
    if (st.code() != StatusCode::kNotFound && st.code() != StatusCode::kDataLoss) return st;
    report.problems.push_back(f.name + ": " + st.message());
  }
  FP_ASSIGN_OR_RETURN(VerifyReport checked, verify_checkpoint(join_path(root, tag), engine));
  checked.problems.insert(checked.problems.begin(), report.problems.begin(), report.problems.end());
  return checked;
}

}  // namespace fastpersist::checkpoint
