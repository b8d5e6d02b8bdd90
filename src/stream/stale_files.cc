// SPDX-License-Identifier: Apache-2.0
// Removal of dead writers' temporaries; the reasoning is in src/stream/stale_files.h.
#include "stream/stale_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "common/unique_fd.h"
#include "stream/parallel_commit.h"
#include "stream/writer_files.h"

namespace fastpersist {
namespace {

using stream::kPartialSuffix;
using stream::kTempInfix;
using stream::kTempRandomChars;

enum class Verdict { kRemoved, kInUse, kGone, kFailed };

// Takes the file's lock without waiting; a writer holds it for the file's whole life, so
// getting it proves the writer is dead. Removes the file while still holding the lock, and only
// if the name still refers to the locked file.
Verdict remove_if_dead(const std::string& path, bool dry_run, uint64_t* bytes, std::string* why) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return Verdict::kGone;  // committed or aborted meanwhile
    *why = std::strerror(errno);
    return Verdict::kFailed;
  }
  struct stat held {};
  if (::fstat(fd.get(), &held) != 0 || !S_ISREG(held.st_mode)) {
    *why = "not a regular file";
    return Verdict::kFailed;
  }
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) return Verdict::kInUse;
    *why = std::string("cannot lock it: ") + std::strerror(errno);
    return Verdict::kFailed;
  }
  struct stat named {};
  if (::lstat(path.c_str(), &named) != 0 || named.st_ino != held.st_ino ||
      named.st_dev != held.st_dev) {
    return Verdict::kGone;
  }
  *bytes = static_cast<uint64_t>(held.st_blocks) * 512;  // what removing it gives back
  if (!dry_run && ::unlink(path.c_str()) != 0) {
    *why = std::strerror(errno);
    return Verdict::kFailed;
  }
  return Verdict::kRemoved;
}

}  // namespace

bool is_parallel_set_name(const std::string& name, std::string* target_name) {
  const size_t n = kPartialSuffix.size();
  if (name.size() < 2 + n || name[0] != '.' ||
      name.compare(name.size() - n, n, kPartialSuffix) != 0) {
    return false;
  }
  if (target_name != nullptr) *target_name = name.substr(1, name.size() - 1 - n);
  return true;
}

bool is_writer_temp_name(const std::string& name, std::string* target_name) {
  const size_t n = kTempInfix.size();
  if (name.size() < 1 + n + kTempRandomChars || name[0] != '.') return false;
  size_t infix = name.size() - kTempRandomChars - n;
  if (name.compare(infix, n, kTempInfix) != 0 || infix < 2) return false;
  if (target_name != nullptr) *target_name = name.substr(1, infix - 1);
  return true;
}

namespace {

// One directory's temporaries into `report`; with `subdirs`, also collects the directories in it
// (not symlinks, same filesystem as `device`).
Status clean_one_dir(const std::string& dir, const StaleFileOptions& options,
                     StaleFileReport& report, dev_t device, std::vector<std::string>* subdirs) {
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  if (d == nullptr) return Status::from_errno(errno, "cannot read the directory").with_path(dir);
  auto path_of = [&](const std::string& name) {
    return (dir.empty() || dir.back() == '/' ? dir : dir + "/") + name;
  };
  std::vector<std::string> temps, sets;
  errno = 0;
  while (const dirent* e = ::readdir(d.get())) {
    std::string name = e->d_name, target;
    if (subdirs != nullptr && name != "." && name != "..") {
      struct stat st {};
      if (::lstat(path_of(name).c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_dev == device) {
        subdirs->push_back(path_of(name));
      }
    }
    if (is_writer_temp_name(name, &target)) {
      if (options.target_name.empty() || target == options.target_name) temps.push_back(name);
    } else if (options.parallel_sets && is_parallel_set_name(name, &target)) {
      if (options.target_name.empty() || target == options.target_name) sets.push_back(name);
    }
  }
  if (errno != 0) return Status::from_errno(errno, "cannot read the directory").with_path(dir);
  std::sort(temps.begin(), temps.end());
  std::sort(sets.begin(), sets.end());
  for (const std::string& name : temps) {
    std::string path = path_of(name);
    uint64_t bytes = 0;
    std::string why;
    switch (remove_if_dead(path, options.dry_run, &bytes, &why)) {
      case Verdict::kRemoved:
        report.removed.push_back(path);
        report.removed_bytes += bytes;
        break;
      case Verdict::kInUse:
        report.in_use.push_back(path);
        break;
      case Verdict::kFailed:
        report.failed.emplace_back(path, why);
        break;
      case Verdict::kGone:
        break;
    }
  }
  for (const std::string& name : sets) {
    std::string path = path_of(name);
    uint64_t bytes = 0;
    Result<stream::AbandonedSet> r = stream::remove_abandoned_set(
        path, options.parallel_set_min_age_seconds, options.dry_run, &bytes);
    if (!r.is_ok()) {
      report.failed.emplace_back(path, r.status().message());
      continue;
    }
    switch (*r) {
      case stream::AbandonedSet::kRemoved:
        report.removed.push_back(path);
        report.removed_bytes += bytes;
        break;
      case stream::AbandonedSet::kInUse:
        report.in_use.push_back(path);
        break;
      case stream::AbandonedSet::kTooRecent:
        report.too_recent.push_back(path);
        break;
      case stream::AbandonedSet::kGone:
        break;
    }
  }
  return Status::ok();
}

}  // namespace

Result<StaleFileReport> remove_stale_temp_files(const std::string& dir,
                                                const StaleFileOptions& options) {
  struct stat top {};
  if (::stat(dir.c_str(), &top) != 0)
    return Status::from_errno(errno, "cannot read the directory").with_path(dir);
  StaleFileReport report;
  std::vector<std::string> pending;
  FP_RETURN_IF_ERROR(
      clean_one_dir(dir, options, report, top.st_dev, options.recursive ? &pending : nullptr));
  std::sort(pending.begin(), pending.end());
  std::reverse(pending.begin(), pending.end());  // a stack: visit in name order
  while (!pending.empty()) {
    std::string sub = std::move(pending.back());
    pending.pop_back();
    std::vector<std::string> found;
    Status st = clean_one_dir(sub, options, report, top.st_dev, &found);
    if (!st.is_ok()) report.failed.emplace_back(sub, st.message());
    std::sort(found.rbegin(), found.rend());
    for (std::string& f : found) pending.push_back(std::move(f));
  }
  return report;
}

}  // namespace fastpersist
