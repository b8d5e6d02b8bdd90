// SPDX-License-Identifier: Apache-2.0
// See delta_base.h.
#include "load/delta_base.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/align.h"
#include "common/printable.h"
#include "load/chunk_table.h"

namespace fastpersist::checkpoint {

ManifestTensor DeltaBaseBytes::base_tensor(const ManifestTensor& delta) {
  ManifestTensor base;
  base.name = delta.name;
  base.dtype = delta.dtype;
  base.shape = delta.shape;
  base.length = delta.length;
  if (delta.delta_base) {
    const DeltaBase& b = *delta.delta_base;
    base.file = b.file;
    base.offset = b.offset;
    base.stored_length = b.stored_length;
    base.encoding = b.encoding;
    base.checksum = b.checksum;
  }
  return base;
}

Result<std::shared_ptr<const DeltaBaseBytes>> DeltaBaseBytes::open(const ManifestTensor& delta,
                                                                   const std::string& path) {
  if (!delta.delta_base) {
    return Status(StatusCode::kInternal, tensor_place(delta) + " is not an XOR delta");
  }
  ManifestTensor base = base_tensor(delta);
  FP_ASSIGN_OR_RETURN(RegularFile file,
                      open_regular_file(path, Symlinks::kRefuse, "checkpoint file"));
  if (base.offset > file.size || base.stored_length > file.size - base.offset) {
    return Status(StatusCode::kDataLoss,
                  "the base of " + tensor_place(delta) + " runs past the end of its file (" +
                      std::to_string(file.size) + " bytes): the base checkpoint is damaged")
        .with_path(path);
  }
  std::optional<ChunkTable> table;
  if (base.encoding != kEncodingRaw) {
    Result<ChunkTable> read = read_chunk_table(path, base);
    if (!read.is_ok()) {
      return Status(StatusCode::kDataLoss,
                    "the base of " + tensor_place(delta) + ": " + read.status().message())
          .with_path(path);
    }
    table = std::move(read).value();
  }
  return std::shared_ptr<const DeltaBaseBytes>(
      new DeltaBaseBytes(std::move(base), path, std::move(file), std::move(table)));
}

namespace {

constexpr uint64_t kDirectAlignment = 4096;
constexpr size_t kDirectPieceBytes = size_t{8} << 20;

// A per-thread aligned buffer for O_DIRECT reads, kDirectPieceBytes + 2 alignments.
std::byte* direct_buffer() {
  struct Buffer {
    std::byte* data = nullptr;
    ~Buffer() { std::free(data); }
  };
  thread_local Buffer buffer;
  if (buffer.data == nullptr) {
    buffer.data = static_cast<std::byte*>(
        std::aligned_alloc(kDirectAlignment, kDirectPieceBytes + 2 * kDirectAlignment));
  }
  return buffer.data;
}

}  // namespace

DeltaBaseBytes::DeltaBaseBytes(ManifestTensor base, std::string path, RegularFile file,
                               std::optional<ChunkTable> table)
    : base_(std::move(base)),
      path_(std::move(path)),
      file_(std::move(file)),
      table_(std::move(table)) {
  // The same file again (same device and inode: nothing swapped in between), O_DIRECT.
  UniqueFd direct(::open(path_.c_str(), O_RDONLY | O_DIRECT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  struct stat st {};
  if (direct.valid() && ::fstat(direct.get(), &st) == 0 && st.st_dev == file_.st.st_dev &&
      st.st_ino == file_.st.st_ino) {
    direct_ = std::move(direct);
  }
}

Status DeltaBaseBytes::damaged(const std::string& why) const {
  return Status(StatusCode::kDataLoss,
                "the base of " + tensor_place(base_) + " is damaged (" + why + ")")
      .with_path(path_);
}

Status DeltaBaseBytes::pread_exact(std::byte* out, size_t n, uint64_t offset) const {
  if (!direct_.valid()) return pread_buffered(out, n, offset);
  std::byte* buffer = direct_buffer();
  if (buffer == nullptr) return pread_buffered(out, n, offset);
  for (size_t done = 0; done < n;) {
    const size_t want = std::min(n - done, kDirectPieceBytes);
    const uint64_t at = offset + done;
    const uint64_t begin = align_down(at, kDirectAlignment);
    const size_t skip = static_cast<size_t>(at - begin);
    const size_t span = static_cast<size_t>(align_up(skip + want, kDirectAlignment));
    size_t got = 0;
    while (got < skip + want) {
      ssize_t r = ::pread(direct_.get(), buffer + got, span - got, static_cast<off_t>(begin + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && errno == EINVAL && got == 0)
        return pread_buffered(out + done, n - done, at);  // refused after all
      if (r < 0)
        return Status::from_errno(errno, "cannot read the base of " + tensor_place(base_))
            .with_path(path_);
      if (r == 0) return damaged("its file ends early");
      got += static_cast<size_t>(r);
      // A direct read comes back short of an aligned end only at the end of the file.
      if (got % kDirectAlignment != 0 && got < skip + want) return damaged("its file ends early");
    }
    std::memcpy(out + done, buffer + skip, want);
    done += want;
  }
  return Status::ok();
}

Status DeltaBaseBytes::pread_buffered(std::byte* out, size_t n, uint64_t offset) const {
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(file_.fd.get(), out + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      return Status::from_errno(errno, "cannot read the base of " + tensor_place(base_))
          .with_path(path_);
    if (r == 0) return damaged("its file ends early");
    done += static_cast<size_t>(r);
  }
  return Status::ok();
}

Status DeltaBaseBytes::read(uint64_t offset, size_t n, std::byte* out) const {
  if (offset > base_.length || n > base_.length - offset) {
    return Status(StatusCode::kInternal, "a read past the base of " + tensor_place(base_));
  }
  if (!table_) return pread_exact(out, n, base_.offset + offset);
  // Every chunk the range covers, decoded whole (into `out` when the range holds all of it).
  thread_local ChunkCodec codec;
  thread_local std::vector<std::byte> frame;
  thread_local std::vector<std::byte> chunk;
  const ChunkTable& table = *table_;
  const uint64_t end = offset + n;
  for (uint64_t k = offset / table.chunk_bytes;
       k < table.chunks() && uint64_t{table.chunk_bytes} * k < end; ++k) {
    const uint64_t chunk_begin = uint64_t{table.chunk_bytes} * k;
    const size_t raw_bytes = static_cast<size_t>(table.chunk_raw_bytes(k, base_.length));
    const uint64_t frame_begin = table.frame_offsets[k];
    const uint64_t frame_size = table.frame_offsets[k + 1] - frame_begin;
    // No honest frame of a chunk is larger than the codec's bound: a table that says so would
    // only make this allocate.
    if (frame_size > chunk_frame_bound(table.compression, raw_bytes)) {
      return damaged("compressed chunk " + std::to_string(k) +
                     " is larger than any frame of its size");
    }
    const size_t frame_bytes = static_cast<size_t>(frame_size);
    frame.resize(frame_bytes);
    FP_RETURN_IF_ERROR(pread_exact(frame.data(), frame_bytes, base_.offset + frame_begin));
    const uint64_t take_begin = std::max(offset, chunk_begin);
    const uint64_t take_end = std::min(end, chunk_begin + raw_bytes);
    const bool whole = take_begin == chunk_begin && take_end == chunk_begin + raw_bytes;
    std::byte* into = out + (take_begin - offset);
    if (!whole) {
      chunk.resize(raw_bytes);
      into = chunk.data();
    }
    Status st =
        codec.decode(table.compression, table.width, frame.data(), frame_bytes, into, raw_bytes);
    if (!st.is_ok()) return damaged("compressed chunk " + std::to_string(k) + ": " + st.message());
    if (!whole) {
      std::memcpy(out + (take_begin - offset), chunk.data() + (take_begin - chunk_begin),
                  static_cast<size_t>(take_end - take_begin));
    }
  }
  return Status::ok();
}

}  // namespace fastpersist::checkpoint
