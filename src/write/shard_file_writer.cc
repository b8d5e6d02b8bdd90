// SPDX-License-Identifier: Apache-2.0
#include "write/shard_file_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <string>

#include "common/unique_fd.h"
#include "fastpersist/checksum.h"
#include "write/staging_copy.h"

namespace fastpersist::checkpoint {
namespace {

struct InFlight {
  IoTicket ticket;
  std::unique_ptr<PinnedBuffer> window;
};

// The bytes of the file in order: the header, then each tensor of the file.
class SourceCursor {
 public:
  SourceCursor(const PlannedFile& file, const std::vector<TensorSource>& sources,
               ShardFileOutcome* sums, bool checksums, bool digests)
      : file_(file), sources_(sources), sums_(sums), checksums_(checksums), digests_(digests) {
    sums_->header = checksums ? xxh3_64(file.header.data(), file.header.size()) : 0;
    sums_->tensors.assign(file.tensors.size(), 0);
    if (digests_) sums_->digests.assign(file.tensors.size(), ContentDigest{});
    piece_ = -1;
    advance_empty();
  }

  // Copies up to `n` bytes into `window`; `*copied` says how many (staging_copy.h).
  Status copy(PinnedBuffer& window, size_t n, size_t* copied) {
    std::byte* dst = window.data();
    size_t done = 0;
    Status st;
    while (done < n && !finished()) {
      size_t take = static_cast<size_t>(std::min<uint64_t>(piece_size() - pos_, n - done));
      if (piece_ < 0) {
        std::memcpy(dst + done, piece_data() + pos_, take);  // the header: not a tensor's bytes
      } else {
        StagingHash hash{checksums_ || digests_ ? &stream_ : nullptr, &sums_->checksum_seconds};
        st = stage_bytes(*piece_source(), pos_, take, window, dst + done, hash);
        if (!st.is_ok()) break;
      }
      pos_ += take;
      done += take;
      if (pos_ == piece_size()) next_piece();
    }
    *copied = done;
    return st;
  }
  bool finished() const { return piece_ >= static_cast<long>(file_.tensors.size()); }

 private:
  const TensorSource* piece_source() const {
    return piece_ < 0 ? nullptr : &sources_[file_.tensors[static_cast<size_t>(piece_)]];
  }
  const std::byte* piece_data() const {
    if (piece_ < 0) return reinterpret_cast<const std::byte*>(file_.header.data());
    return sources_[file_.tensors[static_cast<size_t>(piece_)]].data;
  }
  uint64_t piece_size() const {
    if (piece_ < 0) return file_.header.size();
    return sources_[file_.tensors[static_cast<size_t>(piece_)]].nbytes;
  }
  void record() {
    if (checksums_) sums_->tensors[static_cast<size_t>(piece_)] = stream_.digest();
    if (digests_) sums_->digests[static_cast<size_t>(piece_)] = stream_.digest128();
  }
  void next_piece() {
    if (piece_ >= 0) record();
    ++piece_;
    pos_ = 0;
    stream_.reset();
    advance_empty();
  }
  // Empty tensors have a checksum but no bytes.
  void advance_empty() {
    while (!finished() && piece_ >= 0 && piece_size() == 0) {
      record();
      ++piece_;
      stream_.reset();
    }
    if (piece_ < 0 && file_.header.empty()) next_piece();
  }

  const PlannedFile& file_;
  const std::vector<TensorSource>& sources_;
  ShardFileOutcome* sums_;
  const bool checksums_;
  const bool digests_;
  long piece_;
  uint64_t pos_ = 0;
  Xxh3Stream stream_;
};

// Waits for the oldest request and gives its window back.
Status reap_one(std::deque<InFlight>& inflight, StagingPool& pool) {
  InFlight f = std::move(inflight.front());
  inflight.pop_front();
  auto r = f.ticket.wait();
  pool.release(std::move(f.window));
  return r.status();
}

Status reap_all(std::deque<InFlight>& inflight, StagingPool& pool, Status first) {
  while (!inflight.empty()) {
    Status st = reap_one(inflight, pool);
    if (first.is_ok() && !st.is_ok()) first = st;
  }
  return first;
}

Status preallocate(int fd, uint64_t size, const std::string& path) {
  if (size == 0) return Status::ok();
  int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(size));
  if (rc == 0 || rc == EOPNOTSUPP || rc == EINVAL) return Status::ok();  // not supported here
  return Status::from_errno(rc, "cannot allocate the data file")
      .with_path(path)
      .with_range(0, size);
}

}  // namespace

Result<UniqueFd> create_data_file(const ShardWriteArgs& a, ShardFileOutcome* out) {
  UniqueFd fd(::open(a.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    int err = errno;
    if (err == EEXIST) {
      return Status(StatusCode::kAlreadyExists, "the data file already exists", err)
          .with_path(a.path);
    }
    return Status::from_errno(err, "cannot create the data file").with_path(a.path);
  }
  out->created = true;
  return fd;
}

Status write_shard_file(const ShardWriteArgs& a, ShardFileOutcome* out) {
  const PlannedFile& file = *a.file;
  FP_ASSIGN_OR_RETURN(UniqueFd fd, create_data_file(a, out));
  Status first = preallocate(fd.get(), file.size, a.path);
  bool snapshot_signalled = false;

  SourceCursor cursor(file, *a.sources, out, a.checksums, a.digests);
  std::deque<InFlight> inflight;
  uint64_t file_pos = 0;
  while (first.is_ok() && file_pos < file.size) {
    if (a.cancel != nullptr && a.cancel->load(std::memory_order_relaxed)) {
      first = Status(StatusCode::kInternal, "cancelled: another data file of this write failed");
      break;
    }
    auto window = a.pool->try_acquire();
    while (window.is_ok() && !*window) {
      if (!inflight.empty()) {
        Status st = reap_one(inflight, *a.pool);
        if (!st.is_ok()) {
          first = st;
          break;
        }
        window = a.pool->try_acquire();
      } else {
        window = a.pool->acquire();
      }
    }
    if (!first.is_ok()) break;
    if (!window.is_ok()) {
      first = window.status();
      break;
    }
    std::unique_ptr<PinnedBuffer> w = std::move(window).value();
    size_t n =
        static_cast<size_t>(std::min<uint64_t>(a.pool->window_bytes(), file.size - file_pos));
    size_t copied = 0;
    Status copy_status = cursor.copy(*w, n, &copied);
    if (!copy_status.is_ok() || copied != n) {
      a.pool->release(std::move(w));
      first = !copy_status.is_ok()
                  ? std::move(copy_status)
                  : Status(StatusCode::kInternal, "planned file size does not match its tensors");
      first.with_path(a.path);
      break;
    }
    if (cursor.finished() && !snapshot_signalled) {
      snapshot_signalled = true;
      if (a.on_snapshot_done) a.on_snapshot_done();
    }
    IoRequest req;
    req.kind = IoKind::kWrite;
    req.buffer = w->data();
    req.length = n;
    req.fd = fd.get();
    req.file_offset = file_pos;
    auto ticket = a.engine->start(req);
    if (!ticket.is_ok()) {
      a.pool->release(std::move(w));
      first = Status(ticket.status()).with_path(a.path);
      break;
    }
    inflight.push_back({std::move(ticket).value(), std::move(w)});
    file_pos += n;
  }
  first = reap_all(inflight, *a.pool, std::move(first));
  if (!first.is_ok()) {
    // The engine knows the file only as "fd N": name it.
    return first.with_path(a.path);
  }
  if (!snapshot_signalled && a.on_snapshot_done) a.on_snapshot_done();
  if (a.durable && ::fdatasync(fd.get()) != 0) {
    return Status::from_errno(errno, "fdatasync failed").with_path(a.path);
  }
  if (::close(fd.release()) != 0)
    return Status::from_errno(errno, "close failed").with_path(a.path);
  return Status::ok();
}

}  // namespace fastpersist::checkpoint
