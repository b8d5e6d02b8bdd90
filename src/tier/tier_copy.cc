// SPDX-License-Identifier: Apache-2.0
#include "tier/tier_copy.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "checkpoint_dir/checkpoint_fs.h"
#include "fastpersist/checkpoint_commit.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/manifest_index.h"
#include "load/verify_file.h"

namespace fastpersist::checkpoint {
namespace {

constexpr size_t kCopyWindowBytes = size_t{8} << 20;

Status sync_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return Status::from_errno(errno, "cannot open the copied file to sync it").with_path(path);
  int rc = ::fdatasync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0)
    return Status::from_errno(err, "fdatasync of the copied file failed").with_path(path);
  return Status::ok();
}

}  // namespace

CommitContent content_of(Manifest m) {
  CommitContent c;
  c.step = m.step;
  c.metadata_json = std::move(m.metadata_json);
  c.versions = std::move(m.versions);
  c.versions.erase("fastpersist");  // the committing library's version is written anew
  c.world_size = m.world_size;
  c.files = std::move(m.files);
  c.tensors = std::move(m.tensors);
  c.aliases = std::move(m.aliases);
  c.checksums = m.checksum_algorithm != kNoChecksum;
  c.created_unix = m.created_unix;
  c.blocking_seconds = m.blocking_seconds;
  return c;
}

namespace {

// One own file: streamed from `from`, checked, written to `to` (a new file).
Status copy_file_checked(const std::string& dir, const std::string& from, const std::string& to,
                         const Manifest& m, size_t file, const ManifestIndex& index,
                         IoEngine& read_engine, IoEngine& write_engine, bool durable,
                         const CopyPacer& pacer, uint64_t* copied) {
  FP_RETURN_IF_ERROR(write_new_file(to, "", /*durable=*/false));
  uint64_t checked = 0;
  // Small windows: a local snapshot that pauses the copy waits for at most one window's read
  // and one window's write still in flight (the window size does not change the copy's speed).
  // `dir` is where the bases of XOR deltas are read from to check them.
  FileCheck io{read_engine, nullptr, &checked, nullptr, 0, kCopyWindowBytes, nullptr, dir};
  // Paced before each read, not each write: a paused copy then has nothing left in flight
  // but the one window already read and the write of the one before.
  if (pacer) io.before_read = [&] { return pacer(*copied); };
  io.sink = [&](uint64_t offset, const std::byte* data, size_t n) -> Status {
    IoRequest req;
    req.kind = IoKind::kWrite;
    req.buffer = const_cast<std::byte*>(data);  // a write only reads it
    req.length = n;
    req.path = to;
    req.file_offset = offset;
    FP_RETURN_IF_ERROR(write_engine.run(req).status());
    *copied += n;
    return Status::ok();
  };
  std::vector<std::string> problems;
  FP_RETURN_IF_ERROR(check_checkpoint_file(from, m, file, index.tensors_in(file), io, problems));
  if (!problems.empty()) {
    std::string more =
        problems.size() > 1 ? " (and " + std::to_string(problems.size() - 1) + " more)" : "";
    return Status(StatusCode::kDataLoss,
                  "checkpoint '" + m.tag + "' is damaged: " + problems.front() + more)
        .with_path(from);
  }
  return durable ? sync_file(to) : Status::ok();
}

}  // namespace

CopyPacer make_pacer(uint64_t bytes_per_second, const std::atomic<bool>* cancel,
                     std::function<bool()> pause) {
  using Clock = std::chrono::steady_clock;
  auto began = std::make_shared<Clock::time_point>();
  return [bytes_per_second, cancel, began, pause = std::move(pause)](uint64_t copied) -> Status {
    if (copied == 0) *began = Clock::now();
    for (;;) {
      if (cancel != nullptr && cancel->load()) {
        return Status(
            StatusCode::kBusy,
            "the copy was stopped (its manager is closing); the next drain copies it again");
      }
      if (pause && pause()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        continue;
      }
      if (bytes_per_second == 0) return Status::ok();
      double elapsed = std::chrono::duration<double>(Clock::now() - *began).count();
      double needed = static_cast<double>(copied) / static_cast<double>(bytes_per_second);
      if (needed <= elapsed) return Status::ok();
      std::this_thread::sleep_for(std::chrono::duration<double>(std::min(needed - elapsed, 0.05)));
    }
  };
}

Result<CopyResult> copy_checkpoint(const std::string& source_root, const std::string& tag,
                                   IoEngine& read_engine, CheckpointManager& destination,
                                   const CopyPacer& pacer) {
  FP_RETURN_IF_ERROR(validate_tag(tag));
  const std::string dir = join_path(source_root, tag);
  FP_ASSIGN_OR_RETURN(Manifest m, read_manifest(dir));
  auto begun = destination.begin_commit(tag);
  if (!begun.is_ok()) {
    if (begun.status().code() == StatusCode::kAlreadyExists) return CopyResult{};
    return begun.status();
  }
  std::unique_ptr<CheckpointCommit> commit = std::move(begun).value();
  const ManifestIndex index(m);
  CopyResult result{true, 0};
  if (Status st = check_references_against_bases(commit->directory(), m); !st.is_ok()) {
    (void)commit->abort();
    return st;
  }
  for (size_t i = 0; i < m.files.size(); ++i) {
    const ManifestFile& f = m.files[i];
    if (!referenced_checkpoint(f).empty()) continue;  // in the base, which the destination holds
    auto from = resolve_manifest_file(dir, f);
    Status st = from.is_ok()
                    ? copy_file_checked(dir, *from, join_path(commit->directory(), f.name), m, i,
                                        index, read_engine, destination.engine(),
                                        destination.options().durable, pacer, &result.bytes)
                    : from.status();
    if (!st.is_ok()) {
      (void)commit->abort();
      return st;
    }
  }
  FP_RETURN_IF_ERROR(commit->commit(content_of(std::move(m))));
  return result;
}

}  // namespace fastpersist::checkpoint
