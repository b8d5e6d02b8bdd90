// SPDX-License-Identifier: Apache-2.0
// See encoded_read.h.
#include "load/encoded_read.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/printable.h"
#include "common/regular_file.h"
#include "fastpersist/safetensors.h"

namespace fastpersist::checkpoint {
namespace {

Status chunk_damaged(const ManifestTensor& t, size_t chunk, const Status& why) {
  return Status(StatusCode::kDataLoss, tensor_place(t) + ": compressed chunk " +
                                           std::to_string(chunk) + " is damaged (" + why.message() +
                                           ")");
}

}  // namespace

Status ParallelDecode::add(const ManifestTensor& t, const std::byte* stored, std::byte* raw,
                           std::shared_ptr<const DeltaBaseBytes> base) {
  FP_ASSIGN_OR_RETURN(EncodedTensor e, encoded_tensor(t));
  if (e.xor_delta && !base)
    return Status(StatusCode::kInternal, tensor_place(t) + ": an XOR delta without its base");
  FP_ASSIGN_OR_RETURN(ChunkTable table, chunk_table_in_memory(t, stored));
  const size_t width = table.width;
  auto shared = std::make_shared<ChunkTable>(std::move(table));
  for (size_t k = 0; k < shared->chunks(); ++k) {
    group_.run([this, &t, shared, k, width, stored, raw, base] {
      thread_local ChunkCodec codec;
      thread_local std::vector<std::byte> delta;
      const uint64_t begin = shared->frame_offsets[k];
      const uint64_t raw_at = uint64_t{shared->chunk_bytes} * k;
      const size_t raw_bytes = static_cast<size_t>(shared->chunk_raw_bytes(k, t.length));
      const size_t frame_bytes = static_cast<size_t>(shared->frame_offsets[k + 1] - begin);
      Status st;
      if (base) {
        st = base->read(raw_at, raw_bytes, raw + raw_at);
        if (st.is_ok()) {
          delta.resize(raw_bytes);
          Status d = codec.decode(shared->compression, width, stored + begin, frame_bytes,
                                  delta.data(), raw_bytes);
          if (d.is_ok())
            xor_into(raw + raw_at, delta.data(), raw_bytes);
          else
            st = chunk_damaged(t, k, d);
        }
      } else {
        st = codec.decode(shared->compression, width, stored + begin, frame_bytes, raw + raw_at,
                          raw_bytes);
        if (!st.is_ok()) st = chunk_damaged(t, k, st);
      }
      if (!st.is_ok()) {
        std::lock_guard lock(mu_);
        if (first_.is_ok()) first_ = st;
      }
    });
  }
  return Status::ok();
}

Status ParallelDecode::wait() {
  group_.wait();
  std::lock_guard lock(mu_);
  return first_;
}

FrameStream::FrameStream(const ManifestTensor& t, ChunkTable table, Sink sink,
                         std::shared_ptr<const DeltaBaseBytes> base)
    : t_(t),
      table_(std::move(table)),
      width_(table_.width),
      sink_(std::move(sink)),
      base_(std::move(base)) {}

Status FrameStream::feed(const std::byte* data, size_t n) {
  while (n > 0) {
    if (next_chunk_ >= table_.chunks()) {  // the table: already parsed
      stored_pos_ += n;
      return Status::ok();
    }
    const uint64_t frame_end = table_.frame_offsets[next_chunk_ + 1];
    size_t take = static_cast<size_t>(std::min<uint64_t>(n, frame_end - stored_pos_));
    frame_.insert(frame_.end(), data, data + take);
    stored_pos_ += take;
    data += take;
    n -= take;
    if (stored_pos_ == frame_end) FP_RETURN_IF_ERROR(decode_frame());
  }
  return Status::ok();
}

Status FrameStream::decode_frame() {
  const size_t k = next_chunk_++;
  const size_t raw_bytes = static_cast<size_t>(table_.chunk_raw_bytes(k, t_.length));
  if (!raw_) raw_.reset(new std::byte[table_.chunk_bytes]);
  Status st = codec_.decode(table_.compression, width_, frame_.data(), frame_.size(), raw_.get(),
                            raw_bytes);
  frame_.clear();
  if (!st.is_ok()) return chunk_damaged(t_, k, st);
  const uint64_t raw_at = uint64_t{table_.chunk_bytes} * k;
  if (t_.encoding == kEncodingXorZstd) {
    if (!base_)
      return Status(StatusCode::kInternal, tensor_place(t_) + ": an XOR delta without its base");
    if (!base_raw_) base_raw_.reset(new std::byte[table_.chunk_bytes]);
    FP_RETURN_IF_ERROR(base_->read(raw_at, raw_bytes, base_raw_.get()));
    xor_into(raw_.get(), base_raw_.get(), raw_bytes);
  }
  return sink_(raw_at, raw_.get(), raw_bytes);
}

Status FrameStream::finish() const {
  if (next_chunk_ < table_.chunks()) {
    return Status(StatusCode::kDataLoss, tensor_place(t_) + ": the stored bytes end inside chunk " +
                                             std::to_string(next_chunk_));
  }
  return Status::ok();
}

}  // namespace fastpersist::checkpoint
