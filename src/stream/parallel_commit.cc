// SPDX-License-Identifier: Apache-2.0
#include "stream/parallel_commit.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "stream/writer_files.h"

namespace fastpersist::stream {

struct StreamDigest::State {
  XXH3_state_t* xxh = XXH3_createState();
};

StreamDigest::StreamDigest() : state_(std::make_unique<State>()) { XXH3_64bits_reset(state_->xxh); }
StreamDigest::~StreamDigest() { XXH3_freeState(state_->xxh); }
void StreamDigest::update(const void* data, size_t bytes) { XXH3_64bits_update(state_->xxh, data, bytes); }
uint64_t StreamDigest::value() const { return XXH3_64bits_digest(state_->xxh); }

Result<UniqueFd> open_shared_partial(const std::string& target, std::string* partial_path) {
  std::string base = base_of(target);
  if (base.empty() || base == "." || base == "..") {
    return Status(StatusCode::kInvalidArgument, "not a file path").with_path(target);
  }
  *partial_path = dir_of(target) + "/." + base + ".fp-partial";
  // No O_TRUNC: other writers may already have written their stripes.
  int fd = ::open(partial_path->c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return Status::from_errno(errno, "cannot open the shared temporary file").with_path(*partial_path);
  }
  return UniqueFd(fd);
}

namespace {

struct DoneRecord {
  unsigned rank = 0;
  uint64_t total = 0;
  uint64_t digest = 0;
  uint64_t inode = 0;
  unsigned writers = 0;
  uint64_t stripe = 0;

  // Same attempt: same bytes, same file, same partition of the stream into stripes.
  bool same_attempt(const DoneRecord& o) const {
    return total == o.total && digest == o.digest && inode == o.inode && writers == o.writers &&
           stripe == o.stripe;
  }
};

std::vector<DoneRecord> read_records(const std::string& path) {
  std::vector<DoneRecord> out;
  std::ifstream in(path);
  DoneRecord r;
  while (in >> r.rank >> r.total >> r.digest >> r.inode >> r.writers >> r.stripe) out.push_back(r);
  return out;
}

Status write_records(const std::string& path, const std::vector<DoneRecord>& records) {
  std::string tmp = path + ".new";
  {
    std::ofstream out(tmp, std::ios::trunc);
    for (const DoneRecord& r : records) {
      out << r.rank << ' ' << r.total << ' ' << r.digest << ' ' << r.inode << ' ' << r.writers
          << ' ' << r.stripe << '\n';
    }
    out.flush();
    if (!out) return Status(StatusCode::kIoError, "cannot write the writers' record", EIO).with_path(tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return Status::from_errno(errno, "cannot update the writers' record").with_path(path);
  }
  return Status::ok();
}

}  // namespace

Status finish_parallel(UniqueFd& fd, const std::string& partial_path, const std::string& target,
                       uint64_t digest, uint64_t total_bytes, unsigned rank, unsigned num_writers,
                       uint64_t stripe_bytes, bool durable, bool* committed) {
  *committed = false;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::from_errno(errno, "fstat failed").with_path(partial_path);
  if (durable && ::fdatasync(fd.get()) != 0) {
    return Status::from_errno(errno, "fdatasync failed").with_path(partial_path);
  }
  std::string lock_path = partial_path + ".lock";
  UniqueFd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!lock.valid()) return Status::from_errno(errno, "cannot open the writers' lock").with_path(lock_path);
  while (::flock(lock.get(), LOCK_EX) != 0) {
    if (errno != EINTR) return Status::from_errno(errno, "flock failed").with_path(lock_path);
  }

  const DoneRecord mine{rank, total_bytes, digest, static_cast<uint64_t>(st.st_ino), num_writers,
                        stripe_bytes};
  std::string done_path = partial_path + ".done";
  std::vector<DoneRecord> records;
  std::set<unsigned> ranks;
  for (const DoneRecord& r : read_records(done_path)) {
    if (!r.same_attempt(mine)) continue;  // left by a crashed earlier attempt
    if (r.rank != rank && ranks.insert(r.rank).second) records.push_back(r);
  }
  records.push_back(mine);
  ranks.insert(rank);
  if (ranks.size() < num_writers) return write_records(done_path, records);

  // This close completes the set: commit.
  if (::ftruncate(fd.get(), static_cast<off_t>(total_bytes)) != 0) {
    return Status::from_errno(errno, "ftruncate failed").with_path(partial_path);
  }
  if (durable && ::fdatasync(fd.get()) != 0) {
    return Status::from_errno(errno, "fdatasync failed").with_path(partial_path);
  }
  fd.reset();
  FP_RETURN_IF_ERROR(commit_rename(partial_path, target, durable));
  ::unlink(done_path.c_str());
  ::unlink(lock_path.c_str());
  *committed = true;
  return Status::ok();
}

}  // namespace fastpersist::stream
