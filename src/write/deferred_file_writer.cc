// SPDX-License-Identifier: Apache-2.0
// DeferredFileWriter (deferred_file_writer.h): pieces recorded by write(), streamed by persist().
#include "fastpersist/deferred_file_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "checkpoint_dir/checkpoint_fs.h"
#include "common/align.h"
#include "common/unique_fd.h"
#include "fastpersist/checksum.h"

namespace fastpersist {
namespace {

// persist() hands the writer a large piece in slices of this size (multiples of the alignment,
// so the writer's zero-copy path keeps it); check_object_file reads in chunks of this size.
constexpr size_t kSliceBytes = size_t{8} << 20;
// Streams at least this long are hashed on a second thread while they are written.
constexpr uint64_t kParallelHashMinBytes = uint64_t{4} << 20;
// write() copies into blocks of this size (a block holds several small pieces end to end).
constexpr size_t kCopyBlockBytes = size_t{1} << 20;
// snapshot() places each borrowed piece at a multiple of this in its buffer (O_DIRECT's unit).
constexpr uint64_t kSnapshotAlignment = 4096;

Status finished_error(const std::string& path) {
  return Status(StatusCode::kInvalidArgument, "the DeferredFileWriter is finished").with_path(path);
}

bool plain_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

struct Piece {
  const std::byte* data;
  size_t bytes;
  bool borrowed;
};

}  // namespace

class DeferredFileWriter::Impl {
 public:
  Impl(std::string path, std::string name, DeferredFileWriterOptions options,
       std::shared_ptr<IoEngine> engine)
      : path_(std::move(path)),
        name_(std::move(name)),
        options_(std::move(options)),
        engine_(std::move(engine)) {}

  void borrow(const void* data, size_t bytes) {
    if (data == nullptr || bytes == 0) return;
    auto begin = reinterpret_cast<uintptr_t>(data);
    uintptr_t& end = lent_[begin];
    end = std::max(end, begin + bytes);
  }

  Status write(const void* data, size_t bytes) {
    if (finished_) return finished_error(path_);
    if (snapshotted_) {
      return Status(StatusCode::kInvalidArgument, "write() after snapshot()").with_path(path_);
    }
    if (bytes == 0) return Status::ok();
    if (data == nullptr)
      return Status(StatusCode::kInvalidArgument, "write() of a null pointer").with_path(path_);
    stats_.bytes += bytes;
    const auto* src = static_cast<const std::byte*>(data);
    if (bytes >= options_.borrow_min_bytes && lent(src, bytes)) {
      pieces_.push_back({src, bytes, true});
      stats_.borrowed_bytes += bytes;
      return Status::ok();
    }
    copy(src, bytes);
    stats_.copied_bytes += bytes;
    return Status::ok();
  }

  Status snapshot(PinnedBufferPool& pool) {
    if (finished_) return finished_error(path_);
    if (snapshot_ != nullptr || snapshotted_) {
      return Status(StatusCode::kInvalidArgument, "the stream is snapshotted already")
          .with_path(path_);
    }
    uint64_t need = 0;
    for (const Piece& p : pieces_) {
      if (p.borrowed) need = align_up(need, kSnapshotAlignment) + p.bytes;
    }
    if (need > 0) {
      FP_ASSIGN_OR_RETURN(snapshot_, pool.acquire(static_cast<size_t>(need)));
      std::byte* at = snapshot_->data();
      for (Piece& p : pieces_) {
        if (!p.borrowed) continue;
        at = snapshot_->data() +
             align_up(static_cast<uint64_t>(at - snapshot_->data()), kSnapshotAlignment);
        std::memcpy(at, p.data, p.bytes);
        p.data = at;
        at += p.bytes;
      }
    }
    snapshotted_ = true;
    stats_.snapshot_bytes = stats_.borrowed_bytes;
    lent_.clear();  // no piece lies in lent memory any more
    return Status::ok();
  }

  Result<ManifestFile> persist() {
    if (finished_) return finished_error(path_);
    finished_ = true;
    struct stat st;
    if (!options_.replace_existing && ::lstat(path_.c_str(), &st) == 0) {
      return Status(StatusCode::kAlreadyExists, "the file exists already (a file is written once)")
          .with_path(path_);
    }
    FP_ASSIGN_OR_RETURN(std::unique_ptr<FastFileWriter> out,
                        FastFileWriter::open(path_, options_.writer, engine_));
    // The checksum is computed on a second core while this thread stages and writes: both only
    // read the pieces, each in order, and share nothing until the join.
    // A small stream is hashed on this thread, after its writes.
    uint64_t digest = 0;
    std::thread hasher;
    if (options_.checksums && stats_.bytes >= kParallelHashMinBytes) {
      hasher = std::thread([this, &digest] { digest = hash_pieces(); });
    }
    Status written = write_pieces(*out);
    if (hasher.joinable()) {
      hasher.join();
    } else if (options_.checksums) {
      digest = hash_pieces();
    }
    if (!written.is_ok()) {
      out->abort();
      return written;
    }
    FP_RETURN_IF_ERROR(out->close());
    release();
    ManifestFile record;
    record.name = name_;
    record.role = "objects";
    record.size = stats_.bytes;
    record.checksum = digest;
    record.checksum_bytes = stats_.bytes;
    record.rank = options_.rank;
    return record;
  }

  Result<DeferredStream> take_pieces() {
    if (finished_) return finished_error(path_);
    if (snapshotted_) {
      return Status(StatusCode::kInvalidArgument,
                    "a snapshotted stream is persisted, not taken apart")
          .with_path(path_);
    }
    finished_ = true;
    DeferredStream out;
    out.name = name_;
    out.size = stats_.bytes;
    out.rest.reserve(static_cast<size_t>(stats_.copied_bytes));
    uint64_t offset = 0;
    for (const Piece& p : pieces_) {
      if (p.borrowed) {
        out.borrowed.push_back({offset, p.data, p.bytes});
      } else {
        out.rest.append(reinterpret_cast<const char*>(p.data), p.bytes);
      }
      offset += p.bytes;
    }
    release();
    return out;
  }

  void abort() {
    finished_ = true;
    release();
  }

  DeferredFileWriterStats stats() const {
    DeferredFileWriterStats s = stats_;
    s.pieces = pieces_.size();
    return s;
  }
  const std::string& path() const { return path_; }

 private:
  uint64_t hash_pieces() const {
    Xxh3Stream hash;
    for (const Piece& p : pieces_) hash.update(p.data, p.bytes);
    return hash.digest();
  }

  Status write_pieces(FastFileWriter& out) {
    for (const Piece& p : pieces_) {
      for (size_t off = 0; off < p.bytes; off += kSliceBytes) {
        FP_RETURN_IF_ERROR(out.write(p.data + off, std::min(kSliceBytes, p.bytes - off)));
      }
    }
    return Status::ok();
  }

  // Whether [p, p + n) lies inside one lent range.
  bool lent(const std::byte* p, size_t n) const {
    auto begin = reinterpret_cast<uintptr_t>(p);
    auto it = lent_.upper_bound(begin);
    if (it == lent_.begin()) return false;
    --it;
    // `begin < end` first: past the range's end, end - begin would wrap around.
    return begin >= it->first && begin < it->second && n <= it->second - begin;
  }

  void copy(const std::byte* src, size_t bytes) {
    while (bytes > 0) {
      if (blocks_.empty() || block_used_ == blocks_.back().size()) {
        blocks_.emplace_back(std::max(kCopyBlockBytes, bytes));
        block_used_ = 0;
      }
      std::vector<std::byte>& block = blocks_.back();
      size_t n = std::min(bytes, block.size() - block_used_);
      std::memcpy(block.data() + block_used_, src, n);
      const std::byte* at = block.data() + block_used_;
      // A piece that continues the previous copy in the same block extends it.
      if (!pieces_.empty() && !pieces_.back().borrowed &&
          pieces_.back().data + pieces_.back().bytes == at && block_used_ != 0) {
        pieces_.back().bytes += n;
      } else {
        pieces_.push_back({at, n, false});
      }
      block_used_ += n;
      src += n;
      bytes -= n;
    }
  }

  void release() {
    pieces_.clear();
    pieces_.shrink_to_fit();
    blocks_.clear();
    lent_.clear();
    snapshot_.reset();  // back to its pool
  }

  std::string path_;
  std::string name_;
  DeferredFileWriterOptions options_;
  std::shared_ptr<IoEngine> engine_;
  std::map<uintptr_t, uintptr_t> lent_;  // begin -> end of each lent range
  std::vector<Piece> pieces_;
  // Copies; a block's storage never moves (blocks are whole vectors, never resized).
  std::vector<std::vector<std::byte>> blocks_;
  size_t block_used_ = 0;
  // snapshot(): the borrowed pieces' copies (the pieces point into it; back to its pool when
  // released).
  std::shared_ptr<PinnedBuffer> snapshot_;
  bool snapshotted_ = false;
  DeferredFileWriterStats stats_;
  bool finished_ = false;
};

Result<std::unique_ptr<DeferredFileWriter>> DeferredFileWriter::create(
    const std::string& directory, const std::string& name, const DeferredFileWriterOptions& options,
    std::shared_ptr<IoEngine> engine) {
  if (!plain_name(name)) {
    return Status(StatusCode::kInvalidArgument,
                  "a checkpoint file needs a plain file name, not '" + name + "'")
        .with_path(directory);
  }
  std::string path = checkpoint::join_path(directory, name);
  struct stat st;
  if (!options.replace_existing && ::lstat(path.c_str(), &st) == 0) {
    return Status(StatusCode::kAlreadyExists, "the file exists already (a file is written once)")
        .with_path(path);
  }
  if (!engine) {
    FP_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> own, IoEngine::create(EngineOptions{}));
    engine = std::move(own);
  }
  auto impl = std::make_unique<Impl>(std::move(path), name, options, std::move(engine));
  return std::unique_ptr<DeferredFileWriter>(new DeferredFileWriter(std::move(impl)));
}

DeferredFileWriter::DeferredFileWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeferredFileWriter::~DeferredFileWriter() = default;
void DeferredFileWriter::borrow(const void* data, size_t bytes) { impl_->borrow(data, bytes); }
Status DeferredFileWriter::write(const void* data, size_t bytes) {
  return impl_->write(data, bytes);
}
Status DeferredFileWriter::snapshot(PinnedBufferPool& pool) { return impl_->snapshot(pool); }
Result<ManifestFile> DeferredFileWriter::persist() { return impl_->persist(); }
Result<DeferredStream> DeferredFileWriter::take_pieces() { return impl_->take_pieces(); }
void DeferredFileWriter::abort() { impl_->abort(); }
DeferredFileWriterStats DeferredFileWriter::stats() const { return impl_->stats(); }
const std::string& DeferredFileWriter::path() const { return impl_->path(); }

Status check_object_file(const std::string& path, const ManifestFile& record, bool checksums) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid())
    return Status::from_errno(errno, "cannot open a checkpoint file").with_path(path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0)
    return Status::from_errno(errno, "cannot examine a checkpoint file").with_path(path);
  if (!S_ISREG(st.st_mode))
    return Status(StatusCode::kDataLoss, "not a regular file").with_path(path);
  if (static_cast<uint64_t>(st.st_size) != record.size) {
    return Status(StatusCode::kDataLoss, "the file has " + std::to_string(st.st_size) +
                                             " bytes, its manifest record says " +
                                             std::to_string(record.size))
        .with_path(path);
  }
  if (!checksums) return Status::ok();
  if (record.checksum_bytes > record.size) {
    return Status(StatusCode::kDataLoss,
                  "the manifest record's checksum covers more bytes than the file has")
        .with_path(path);
  }
  (void)::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<std::byte> chunk(
      std::min<uint64_t>(kSliceBytes, std::max<uint64_t>(record.checksum_bytes, 1)));
  Xxh3Stream hash;
  uint64_t done = 0;
  while (done < record.checksum_bytes) {
    size_t want =
        static_cast<size_t>(std::min<uint64_t>(chunk.size(), record.checksum_bytes - done));
    ssize_t n = ::pread(fd.get(), chunk.data(), want, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::from_errno(errno, "cannot read a checkpoint file").with_path(path);
    if (n == 0)
      return Status(StatusCode::kDataLoss, "the file ended early while it was checked")
          .with_path(path);
    hash.update(chunk.data(), static_cast<size_t>(n));
    done += static_cast<uint64_t>(n);
  }
  if (uint64_t have = hash.digest(); have != record.checksum) {
    return Status(StatusCode::kDataLoss, "checksum mismatch: xxh3-64 " + checksum_to_hex(have) +
                                             ", the manifest says " +
                                             checksum_to_hex(record.checksum))
        .with_path(path);
  }
  return Status::ok();
}

}  // namespace fastpersist
