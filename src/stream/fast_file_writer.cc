// SPDX-License-Identifier: Apache-2.0
// FastFileWriter: staging, draining and the single-writer commit. The protocol is described at
// the top of include/fastpersist/fast_file_writer.h; the parallel rendezvous is in
// parallel_commit.cc.
#include "fastpersist/fast_file_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "common/align.h"
#include "common/unique_fd.h"
#include "fastpersist/pinned_buffer.h"
#include "stream/parallel_commit.h"
#include "stream/stale_files.h"
#include "stream/writer_files.h"

namespace fastpersist {
namespace {

// Staging halves, stripes and zero-copy runs are cut at this granularity, which every O_DIRECT
// alignment we meet divides (logical blocks of 512 or 4096 bytes, 4 KiB pages).
constexpr uint64_t kStreamAlignment = 4096;
// The first preallocation step; later ones double, up to
// FastFileWriterOptions::preallocate_max_bytes.
constexpr uint64_t kMinPreallocateStep = uint64_t{256} << 20;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

// All of a writer's state; FastFileWriter forwards to it, so the public header shows no member
// but this pointer.
class FastFileWriter::Impl {
 public:
  Impl(std::string path, FastFileWriterOptions options)
      : path_(std::move(path)), options_(options) {}

  Status write(const void* data, size_t bytes);
  Status close();
  void abort();

  enum class State { kOpen, kClosed, kAborted };

  bool owns(uint64_t stream_offset) const;
  uint64_t own_range_end(uint64_t stream_offset, uint64_t limit) const;
  Status write_own(const std::byte* p, size_t n);
  // Whether bytes at `p`, stream position `pos`, up to `run_end`, may skip the staging copy.
  bool zero_copy_candidate(const std::byte* p, uint64_t pos, uint64_t run_end) const;
  Status drain();
  Status wait_half(int half);
  Status wait_all();
  Status fail(Status st);
  Status finish_single();
  Status finish_parallel();
  Status ensure_allocated(uint64_t end);

  std::string path_;
  std::string temp_path_;
  FastFileWriterOptions options_;
  std::shared_ptr<IoEngine> engine_;
  UniqueFd fd_;
  std::shared_ptr<PinnedBuffer> staging_;
  IoTicket in_flight_[2];
  std::unique_ptr<stream::StreamDigest> digest_;  // parallel writers only
  uint32_t memory_alignment_ = 512;
  State state_ = State::kOpen;
  bool committed_ = false;
  bool file_committed_ = false;
  Status error_;
  FastFileWriterStats stats_;
  uint64_t pos_ = 0;        // stream offset of the next byte
  int cur_ = 0;             // staging half being filled
  uint64_t cur_start_ = 0;  // file offset of its first byte
  size_t fill_ = 0;         // bytes in it
  size_t half_bytes_ = 0;
  uint64_t allocated_end_ = 0;  // the file is at least this long (preallocated); 0: not yet
  bool preallocate_ = true;     // cleared when fallocate fails (the engine then allocates)
};

std::string FastFileWriterStats::to_string() const {
  auto gbps = [](uint64_t b, double s) { return s > 0 ? static_cast<double>(b) / s / 1e9 : 0.0; };
  char line[512];
  std::snprintf(
      line, sizeof line,
      "stats = {bytes: %llu, persisted_bytes: %llu, write_calls: %llu, write_secs: %.3f, "
      "write_GB/s: %.2f, fill_bytes: %llu, fill_secs: %.3f, fill_GB/s: %.2f, "
      "zero_copy_bytes: %llu, slow_path_bytes: %llu, io_wait_secs: %.3f, drains: %llu, "
      "pinned_bytes: %zu}",
      static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(persisted_bytes),
      static_cast<unsigned long long>(write_calls), write_seconds, gbps(bytes, write_seconds),
      static_cast<unsigned long long>(fill_bytes), fill_seconds, gbps(fill_bytes, fill_seconds),
      static_cast<unsigned long long>(zero_copy_bytes),
      static_cast<unsigned long long>(slow_path_bytes), io_wait_seconds,
      static_cast<unsigned long long>(drains), pinned_bytes);
  return line;
}

FastFileWriter::FastFileWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<FastFileWriter>> FastFileWriter::open(const std::string& path,
                                                             const FastFileWriterOptions& options,
                                                             std::shared_ptr<IoEngine> engine) {
  auto bad = [](std::string m) { return Status(StatusCode::kInvalidArgument, std::move(m)); };
  if (path.empty()) return bad("empty path");
  size_t halves = options.single_io_buffer ? 1 : 2;
  if (options.io_buffer_bytes < halves * kStreamAlignment) {
    return bad("io_buffer_bytes must be at least " + std::to_string(halves * kStreamAlignment));
  }
  if (options.num_writers == 0 || options.writer_rank >= options.num_writers) {
    return bad("writer_rank must be in [0, num_writers)");
  }
  if (options.num_writers > 1 &&
      (options.stripe_bytes == 0 || !is_aligned(options.stripe_bytes, kStreamAlignment))) {
    return bad("stripe_bytes must be a positive multiple of 4096");
  }
  if (!(options.commit_timeout_seconds >= 0) || !std::isfinite(options.commit_timeout_seconds)) {
    return bad("commit_timeout_seconds must be a finite number of seconds >= 0");
  }
  auto w = std::make_unique<Impl>(path, options);
  Impl& impl = *w;
  if (engine == nullptr) {
    FP_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> own, IoEngine::create(EngineOptions{}));
    engine = std::move(own);
  }
  impl.engine_ = std::move(engine);
  w->half_bytes_ =
      static_cast<size_t>(align_down(options.io_buffer_bytes / halves, kStreamAlignment));
  FP_ASSIGN_OR_RETURN(impl.staging_, default_pinned_pool().acquire(w->half_bytes_ * halves));
  w->stats_.pinned_bytes = impl.staging_->capacity();
  if (options.num_writers > 1) {
    FP_ASSIGN_OR_RETURN(impl.fd_, stream::open_shared_partial(path, &w->temp_path_));
    impl.digest_ = std::make_unique<stream::StreamDigest>();
  } else {
    // Debris of earlier writers of this path that died (best effort: a failure to clean up must
    // not fail this save; `fastpersist clean` reports such files).
    StaleFileOptions debris;
    debris.target_name = stream::base_of(path);
    debris.parallel_sets = false;
    (void)remove_stale_temp_files(stream::dir_of(path), debris);
    FP_ASSIGN_OR_RETURN(impl.fd_, stream::create_temp_beside(path, &w->temp_path_));
  }
  w->preallocate_ = options.preallocate_max_bytes > 0;
  Result<FileIoMode> mode = probe_file_io(w->temp_path_);
  impl.memory_alignment_ = mode.is_ok() && mode->direct ? mode->memory_alignment : 1;
  return std::unique_ptr<FastFileWriter>(new FastFileWriter(std::move(w)));
}

FastFileWriter::~FastFileWriter() {
  if (impl_->state_ == Impl::State::kOpen) impl_->abort();
}

Status FastFileWriter::write(const void* data, size_t bytes) { return impl_->write(data, bytes); }
Status FastFileWriter::close() { return impl_->close(); }
void FastFileWriter::abort() { impl_->abort(); }
bool FastFileWriter::closed() const { return impl_->state_ != Impl::State::kOpen; }
bool FastFileWriter::committed() const { return impl_->committed_; }
bool FastFileWriter::file_committed() const { return impl_->file_committed_; }
uint64_t FastFileWriter::bytes_written() const { return impl_->stats_.bytes; }
const std::string& FastFileWriter::path() const { return impl_->path_; }
const std::string& FastFileWriter::temp_path() const { return impl_->temp_path_; }
FastFileWriterStats FastFileWriter::stats() const { return impl_->stats_; }
const FastFileWriterOptions& FastFileWriter::options() const { return impl_->options_; }

bool FastFileWriter::Impl::owns(uint64_t offset) const {
  return options_.num_writers == 1 ||
         (offset / options_.stripe_bytes) % options_.num_writers == options_.writer_rank;
}

uint64_t FastFileWriter::Impl::own_range_end(uint64_t offset, uint64_t limit) const {
  if (options_.num_writers == 1) return limit;
  return std::min(limit, (offset / options_.stripe_bytes + 1) * options_.stripe_bytes);
}

Status FastFileWriter::Impl::fail(Status st) {
  // The engine names the descriptor it was given ("fd 7"); the caller knows the file by its path.
  if (st.path().empty() || st.path().rfind("fd ", 0) == 0) st.with_path(path_);
  if (error_.is_ok()) error_ = st;
  return st;
}

Status FastFileWriter::Impl::write(const void* data, size_t bytes) {
  if (state_ != State::kOpen) {
    return Status(StatusCode::kInvalidArgument, "write to a closed writer").with_path(path_);
  }
  if (!error_.is_ok()) return error_;
  if (bytes == 0) return Status::ok();
  if (data == nullptr) return Status(StatusCode::kInvalidArgument, "null data with nonzero length");
  auto t0 = Clock::now();
  ++stats_.write_calls;
  const auto* p = static_cast<const std::byte*>(data);
  if (digest_) digest_->update(p, bytes);
  Status st = write_own(p, bytes);
  stats_.bytes += bytes;
  stats_.write_seconds += seconds_since(t0);
  return st;
}

bool FastFileWriter::Impl::zero_copy_candidate(const std::byte* p, uint64_t pos,
                                               uint64_t run_end) const {
  return options_.zero_copy &&
         align_down(run_end - pos, kStreamAlignment) >= options_.zero_copy_min_bytes &&
         is_aligned(pos, kStreamAlignment) && is_aligned(p, memory_alignment_);
}

Status FastFileWriter::Impl::write_own(const std::byte* p, size_t n) {
  const uint64_t end = pos_ + n;
  while (pos_ < end) {
    uint64_t run_end = own_range_end(pos_, end);
    if (!owns(pos_)) {  // another writer persists this stripe
      p += run_end - pos_;
      pos_ = run_end;
      continue;
    }
    // An aligned run at an aligned position after some staged bytes (torch.save's storages,
    // 4096-aligned in the file, follow its small records): send the staged bytes first, so the
    // run can go zero-copy. They end at an aligned position, so the partial half is a valid
    // O_DIRECT write.
    if (fill_ != 0 && zero_copy_candidate(p, pos_, run_end) &&
        is_aligned(cur_start_, kStreamAlignment)) {
      FP_RETURN_IF_ERROR(drain());
    }
    if (fill_ == 0) {
      cur_start_ = pos_;
      uint64_t run = align_down(run_end - pos_, kStreamAlignment);
      if (zero_copy_candidate(p, pos_, run_end)) {
        FP_RETURN_IF_ERROR(ensure_allocated(pos_ + run));
        // The caller's memory is only ours until we return: finish this request before that.
        IoRequest r{IoKind::kWrite, const_cast<std::byte*>(p), run, "", fd_.get(), pos_};
        auto t = Clock::now();
        Result<uint64_t> done = engine_->run(r);
        stats_.io_wait_seconds += seconds_since(t);
        if (!done.is_ok()) return fail(done.status());
        stats_.zero_copy_bytes += run;
        stats_.persisted_bytes += run;
        p += run;
        pos_ += run;
        continue;
      }
    }
    size_t take = static_cast<size_t>(std::min<uint64_t>(run_end - pos_, half_bytes_ - fill_));
    auto t = Clock::now();
    std::memcpy(staging_->data() + static_cast<size_t>(cur_) * half_bytes_ + fill_, p, take);
    stats_.fill_seconds += seconds_since(t);
    stats_.fill_bytes += take;
    fill_ += take;
    p += take;
    pos_ += take;
    // Drain a full half, or the end of one of this writer's stripes (the next byte is not ours).
    if (fill_ == half_bytes_ || (options_.num_writers > 1 && pos_ % options_.stripe_bytes == 0)) {
      FP_RETURN_IF_ERROR(drain());
    }
  }
  return Status::ok();
}

Status FastFileWriter::Impl::wait_half(int half) {
  IoTicket& t = in_flight_[half];
  if (!t.valid()) return Status::ok();
  auto start = Clock::now();
  Result<uint64_t> r = t.wait();
  stats_.io_wait_seconds += seconds_since(start);
  t = IoTicket();
  if (!r.is_ok()) return fail(r.status());
  return Status::ok();
}

Status FastFileWriter::Impl::wait_all() {
  Status a = wait_half(0);
  Status b = wait_half(1);
  return a.is_ok() ? b : a;
}

// Submits the half being filled and moves to the other one, waiting for it if still in flight.
Status FastFileWriter::Impl::drain() {
  if (fill_ == 0) return Status::ok();
  FP_RETURN_IF_ERROR(ensure_allocated(cur_start_ + fill_));
  IoRequest r{IoKind::kWrite, staging_->data() + static_cast<size_t>(cur_) * half_bytes_,
              fill_,          "",
              fd_.get(),      cur_start_};
  Result<IoTicket> t = engine_->start(r);
  if (!t.is_ok()) return fail(t.status());
  in_flight_[cur_] = *t;
  ++stats_.drains;
  stats_.persisted_bytes += fill_;
  fill_ = 0;
  if (options_.single_io_buffer) return wait_half(cur_);
  cur_ ^= 1;
  return wait_half(cur_);
}

// Makes the file at least `end` bytes long with one fallocate() that reaches well beyond it.
// fallocate (like a size-extending O_DIRECT write) waits for every direct I/O in flight on the
// inode, so doing it once per large step instead of once per drain keeps both staging halves
// (and the zero-copy writes) streaming to the device. close() truncates the file to the stream
// size. Any failure (ENOSPC near a full disk, EOPNOTSUPP) only stops the preallocation: the
// engine then allocates request by request and reports a real ENOSPC itself.
Status FastFileWriter::Impl::ensure_allocated(uint64_t end) {
  if (!preallocate_ || end <= allocated_end_) return Status::ok();
  uint64_t step =
      std::clamp<uint64_t>(allocated_end_, kMinPreallocateStep,
                           std::max<uint64_t>(options_.preallocate_max_bytes, kMinPreallocateStep));
  uint64_t new_end = align_up(std::max(end, allocated_end_ + step), kStreamAlignment);
  if (::fallocate(fd_.get(), 0, static_cast<off_t>(allocated_end_),
                  static_cast<off_t>(new_end - allocated_end_)) != 0) {
    preallocate_ = false;
    // A fallocate that fails with ENOSPC may still have allocated (and sized the file for) part
    // of the range on ext4; cut that off again, or close() finds the file longer than the stream.
    // Every write so far lies below allocated_end_. Parallel writers share the file, and their
    // commit truncates it to the stream size anyway.
    if (options_.num_writers == 1 &&
        ::ftruncate(fd_.get(), static_cast<off_t>(allocated_end_)) != 0) {
      return fail(
          Status::from_errno(errno, "cannot undo a partial preallocation").with_path(temp_path_));
    }
    return Status::ok();
  }
  allocated_end_ = new_end;
  return Status::ok();
}

Status FastFileWriter::Impl::close() {
  if (state_ == State::kClosed) return Status::ok();
  if (state_ == State::kAborted)
    return Status(StatusCode::kInvalidArgument, "writer was aborted").with_path(path_);
  auto t0 = Clock::now();
  Status st = error_;
  if (st.is_ok() && fill_ > 0) {
    // The final partial half: the engine writes its aligned part O_DIRECT and the unaligned
    // tail through the page cache.
    stats_.slow_path_bytes += fill_ % kStreamAlignment;
    st = drain();
  }
  Status waited = wait_all();
  if (st.is_ok()) st = waited;
  if (st.is_ok()) st = options_.num_writers > 1 ? finish_parallel() : finish_single();
  stats_.write_seconds += seconds_since(t0);
  if (!st.is_ok()) {
    abort();
    return st;
  }
  state_ = State::kClosed;
  return Status::ok();
}

Status FastFileWriter::Impl::finish_single() {
  int fd = fd_.get();
  if (allocated_end_ > pos_ && ::ftruncate(fd, static_cast<off_t>(pos_)) != 0) {
    return Status::from_errno(errno, "cannot truncate the preallocated file").with_path(temp_path_);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Status::from_errno(errno, "fstat failed").with_path(temp_path_);
  if (static_cast<uint64_t>(st.st_size) != pos_) {
    return Status(StatusCode::kInternal, "file size " + std::to_string(st.st_size) +
                                             " differs from the bytes written " +
                                             std::to_string(pos_))
        .with_path(temp_path_);
  }
  if (options_.durable && ::fdatasync(fd) != 0) {
    return Status::from_errno(errno, "fdatasync failed").with_path(temp_path_);
  }
  // Rename while the descriptor (and so the temporary's lock) is still held: a remover of dead
  // writers' temporaries must never take this file for debris.
  FP_RETURN_IF_ERROR(stream::commit_rename(temp_path_, path_, options_.durable));
  fd_.reset();
  committed_ = file_committed_ = true;
  return Status::ok();
}

Status FastFileWriter::Impl::finish_parallel() {
  stream::ParallelWriter writer{path_,
                                temp_path_,
                                options_.writer_rank,
                                options_.num_writers,
                                options_.stripe_bytes,
                                options_.durable,
                                options_.commit_timeout_seconds};
  stream::ParallelCloseResult result;
  Status st = stream::finish_parallel(fd_, writer, digest_->value(), pos_, &result);
  committed_ = result.committed;
  file_committed_ = result.file_committed;
  return st;
}

void FastFileWriter::Impl::abort() {
  if (state_ == State::kAborted || state_ == State::kClosed) return;
  state_ = State::kAborted;
  (void)wait_all();  // the engine may still be writing from our staging memory
  if (options_.num_writers > 1) {
    // The temporary is shared: remove it only under the writers' lock, and only if it is still
    // this writer's file (not a new attempt's, not one already committed).
    stream::abort_parallel(fd_, temp_path_);
    return;
  }
  // Unlink before closing: while the descriptor holds the temporary's lock, no remover of dead
  // writers' files (stale_files.h) takes it for its own.
  if (!temp_path_.empty()) ::unlink(temp_path_.c_str());
  fd_.reset();
}

}  // namespace fastpersist
