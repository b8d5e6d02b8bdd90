// SPDX-License-Identifier: Apache-2.0
// CheckpointReader::read_pieces: one tensor's stored bytes streamed in file order through two
// aligned slots (the sink works on one while the next piece is read into the other); compressed
// tensors decode through a FrameStream on the way. Memory: two slots, whatever the tensor's size.
#include <algorithm>

#include "common/align.h"
#include "fastpersist/checksum.h"
#include "load/encoded_read.h"
#include "load/reader_impl.h"

namespace fastpersist {
namespace {

constexpr uint64_t kReadAlignment = CheckpointReader::Impl::kReadAlignment;

using Consume = std::function<Status(uint64_t pos, const std::byte* data, size_t size)>;

// The two slots and their reads. Every read in flight is waited for before run() returns: the
// slots die with the ring.
class PieceRing {
 public:
  PieceRing(IoEngine& engine, const ManifestTensor& t, const std::string& path, uint64_t file_size,
            uint64_t piece_bytes)
      : engine_(engine), t_(t), path_(path), file_size_(file_size), piece_bytes_(piece_bytes) {}

  Status run(const Consume& consume) {
    const uint64_t stored = t_.stored_length;
    if (stored == 0) return Status::ok();
    for (Slot& slot : slots_) {
      FP_ASSIGN_OR_RETURN(slot.buffer, PinnedBuffer::allocate(
                                           static_cast<size_t>(piece_bytes_ + 2 * kReadAlignment),
                                           /*lock_memory=*/false));
    }
    FP_RETURN_IF_ERROR(submit(slots_[0], 0));
    uint64_t next = slots_[0].size;
    for (size_t cur = 0;; cur ^= 1) {
      Slot& slot = slots_[cur];
      auto done = slot.ticket.wait();
      slot.ticket = IoTicket();
      if (!done.is_ok()) return settle(Status(done.status()).with_path(path_));
      if (done.value() < slot.skip + slot.size) {
        return settle(
            Status(StatusCode::kDataLoss, "short read of tensor '" + t_.name + "' in " + t_.file)
                .with_path(path_)
                .with_range(t_.offset + slot.pos, slot.size));
      }
      if (next < stored) {
        Status st = submit(slots_[cur ^ 1], next);
        if (!st.is_ok()) return settle(st);
        next += slots_[cur ^ 1].size;
      }
      Status st = consume(slot.pos, slot.buffer.data() + slot.skip, slot.size);
      if (!st.is_ok()) return settle(st.with_path(path_));
      if (slot.pos + slot.size == stored) return Status::ok();
    }
  }

 private:
  struct Slot {
    PinnedBuffer buffer;
    IoTicket ticket;
    uint64_t pos = 0;  // offset in the tensor
    size_t size = 0;   // tensor bytes in this piece
    size_t skip = 0;   // bytes before them in the buffer (the read starts 4096-aligned)
  };

  Status submit(Slot& slot, uint64_t pos) {
    slot.pos = pos;
    slot.size = static_cast<size_t>(std::min(piece_bytes_, t_.stored_length - pos));
    uint64_t begin = align_down(t_.offset + pos, kReadAlignment);
    uint64_t end = std::min(align_up(t_.offset + pos + slot.size, kReadAlignment), file_size_);
    slot.skip = static_cast<size_t>(t_.offset + pos - begin);
    IoRequest req;
    req.kind = IoKind::kRead;
    req.buffer = slot.buffer.data();
    req.length = end - begin;
    req.path = path_;
    req.file_offset = begin;
    FP_ASSIGN_OR_RETURN(slot.ticket, engine_.start(req));
    return Status::ok();
  }

  Status settle(Status st) {
    for (Slot& slot : slots_) {
      if (slot.ticket.valid()) (void)slot.ticket.wait();
    }
    return st;
  }

  IoEngine& engine_;
  const ManifestTensor& t_;
  const std::string& path_;
  const uint64_t file_size_;
  const uint64_t piece_bytes_;
  Slot slots_[2];
};

}  // namespace

Status CheckpointReader::Impl::read_pieces(size_t tensor, uint64_t piece_bytes, bool verify,
                                           const PieceSink& sink) {
  if (tensor >= manifest_.tensors.size()) {
    return Status(StatusCode::kInvalidArgument, "tensor index out of range");
  }
  if (piece_bytes == 0 || piece_bytes % kReadAlignment != 0) {
    return Status(StatusCode::kInvalidArgument, "piece_bytes must be a positive multiple of 4096");
  }
  if (manifest_.checksum_algorithm == kNoChecksum) verify = false;
  const ManifestTensor& t = manifest_.tensors[tensor];
  FP_RETURN_IF_ERROR(check_encoding(t));
  const std::string& path = path_of(t);
  if (verify) FP_RETURN_IF_ERROR(check_file_headers({t.file}));

  // What arrives is the stored bytes: raw ones go to the sink as they are; compressed ones
  // through a FrameStream, whose chunks go to the sink in pieces of at most piece_bytes.
  Xxh3Stream hash;
  std::unique_ptr<checkpoint::FrameStream> frames;
  if (t.encoding != kEncodingRaw) {
    FP_ASSIGN_OR_RETURN(ChunkTable table, checkpoint::read_chunk_table(path, t));
    FP_ASSIGN_OR_RETURN(std::shared_ptr<const checkpoint::DeltaBaseBytes> base, delta_base_of(t));
    frames = std::make_unique<checkpoint::FrameStream>(
        t, std::move(table),
        [&](uint64_t offset, const std::byte* data, size_t size) -> Status {
          for (size_t done = 0; done < size;) {
            size_t n = static_cast<size_t>(std::min<uint64_t>(piece_bytes, size - done));
            if (verify) hash.update(data + done, n);
            FP_RETURN_IF_ERROR(sink(offset + done, data + done, n));
            done += n;
          }
          return Status::ok();
        },
        std::move(base));
  }
  PieceRing ring(*engine_, t, path, file_of(t).size, piece_bytes);
  FP_RETURN_IF_ERROR(ring.run([&](uint64_t pos, const std::byte* data, size_t size) -> Status {
    if (frames) return frames->feed(data, size);
    if (verify) hash.update(data, size);
    return sink(pos, data, size);
  }));
  if (frames) FP_RETURN_IF_ERROR(frames->finish().with_path(path));
  if (verify && hash.digest() != t.checksum) {
    return checkpoint::checksum_mismatch(path, t, hash.digest());
  }
  return Status::ok();
}

}  // namespace fastpersist
