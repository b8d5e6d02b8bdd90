// SPDX-License-Identifier: Apache-2.0
// See encoded_file_writer.h.
#include "write/encoded_file_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "common/unique_fd.h"
#include "fastpersist/checksum.h"
#include "fastpersist/safetensors.h"
#include "load/delta_base.h"
#include "write/staging_copy.h"

namespace fastpersist::checkpoint {
namespace {

constexpr size_t kOutputBufferBytes = size_t{8} << 20;
constexpr size_t kOutputBuffers = 4;

// A staging window shared by the chunks staged in it; back to the pool with the last of them.
struct WindowHold {
  StagingPool* pool = nullptr;
  std::unique_ptr<PinnedBuffer> window;
  ~WindowHold() {
    if (window) pool->release(std::move(window));
  }
};

struct Chunk {
  size_t slot = 0;  // the tensor, in file order
  uint64_t raw_pos = 0;
  size_t raw_bytes = 0;
  const std::byte* raw = nullptr;
  std::shared_ptr<WindowHold> window;
  bool considered = false;  // whether to compress has been decided
  bool compress = false;    // with the file's codec
  bool try_xor = false;     // as an XOR delta against the tensor's base
  // Written by the compression task, read after `ready` (under the writer's mutex).
  std::unique_ptr<std::byte[]> frame;
  size_t frame_bytes = 0;
  std::unique_ptr<std::byte[]> xor_frame;
  size_t xor_frame_bytes = 0;
  // Why the delta could not be made (the base unreadable or damaged): the tensor is then
  // stored as without a base, unless an earlier chunk already chose the delta.
  Status xor_status;
  Status status;
  double seconds = 0;
  bool ready = false;
};

// What the emitter knows of each tensor of the file.
struct TensorOut {
  bool decided = false;
  Compression encoding = Compression::kNone;
  bool xor_delta = false;  // encoding is then kZstd
  uint64_t offset = 0;
  std::vector<uint32_t> frames;
};

// Bytes appended in order from `start` on, written by the engine one aligned buffer at a time
// (O_DIRECT for the aligned body), a few buffers in flight.
class OutputStream {
 public:
  OutputStream(IoEngine& engine, int fd, uint64_t start)
      : engine_(engine), fd_(fd), start_(start) {}
  ~OutputStream() { (void)settle(Status::ok()); }

  uint64_t position() const { return start_ + flushed_ + fill_; }

  Status append(const std::byte* data, size_t n) {
    while (n > 0) {
      if (!current_) FP_RETURN_IF_ERROR(next_buffer());
      size_t take = std::min(n, kOutputBufferBytes - fill_);
      std::memcpy(current_->data() + fill_, data, take);
      fill_ += take;
      data += take;
      n -= take;
      if (fill_ == kOutputBufferBytes) FP_RETURN_IF_ERROR(flush());
    }
    return Status::ok();
  }

  // Writes what is left and waits for every write.
  Status finish() {
    Status st = fill_ > 0 ? flush() : Status::ok();
    return settle(st);
  }

  // Waits for every write in flight; the first error (or `first`).
  Status settle(Status first) {
    while (!inflight_.empty()) {
      Status st = reap();
      if (first.is_ok() && !st.is_ok()) first = st;
    }
    return first;
  }

 private:
  struct InFlight {
    IoTicket ticket;
    std::unique_ptr<PinnedBuffer> buffer;
  };

  Status next_buffer() {
    if (!free_.empty()) {
      current_ = std::move(free_.back());
      free_.pop_back();
    } else if (allocated_ < kOutputBuffers) {
      FP_ASSIGN_OR_RETURN(PinnedBuffer b,
                          PinnedBuffer::allocate(kOutputBufferBytes, /*lock_memory=*/false,
                                                 /*cuda_register=*/false));
      current_ = std::make_unique<PinnedBuffer>(std::move(b));
      ++allocated_;
    } else {
      FP_RETURN_IF_ERROR(reap());
      current_ = std::move(free_.back());
      free_.pop_back();
    }
    fill_ = 0;
    return Status::ok();
  }

  Status flush() {
    IoRequest req;
    req.kind = IoKind::kWrite;
    req.buffer = current_->data();
    req.length = fill_;
    req.fd = fd_;
    req.file_offset = start_ + flushed_;
    FP_ASSIGN_OR_RETURN(IoTicket ticket, engine_.start(req));
    inflight_.push_back({std::move(ticket), std::move(current_)});
    flushed_ += fill_;
    fill_ = 0;
    return Status::ok();
  }

  Status reap() {
    InFlight f = std::move(inflight_.front());
    inflight_.pop_front();
    Result<uint64_t> r = f.ticket.wait();
    free_.push_back(std::move(f.buffer));
    return r.status();
  }

  IoEngine& engine_;
  const int fd_;
  const uint64_t start_;
  uint64_t flushed_ = 0;  // bytes handed to the engine
  size_t fill_ = 0;       // bytes in current_
  size_t allocated_ = 0;
  std::unique_ptr<PinnedBuffer> current_;
  std::vector<std::unique_ptr<PinnedBuffer>> free_;
  std::deque<InFlight> inflight_;
};

class EncodedWriter {
 public:
  EncodedWriter(const ShardWriteArgs& a, ShardFileOutcome* out, int fd)
      : a_(a),
        file_(*a.file),
        out_(out),
        fd_(fd),
        chunk_bytes_(
            static_cast<uint32_t>(std::min<size_t>(kCodecChunkBytes, a.pool->window_bytes()))),
        frame_capacity_(chunk_frame_bound(a.compression, chunk_bytes_)),
        xor_frame_capacity_(chunk_frame_bound(Compression::kZstd, chunk_bytes_)),
        xor_level_(a.compression == Compression::kZstd
                       ? a.compression_level
                       : default_compression_level(Compression::kZstd)),
        max_ahead_(std::max<size_t>(4, 2 * std::max<size_t>(a.compressors->threads(), 1))),
        tasks_(*a.compressors),
        output_(*a.engine, fd, file_.encoded_header_bytes),
        tensors_(file_.tensors.size()) {
    out_->tensors.assign(file_.tensors.size(), 0);
    if (a_.digests) out_->digests.assign(file_.tensors.size(), ContentDigest{});
  }

  ~EncodedWriter() {
    tasks_.wait();  // no task may outlive the chunks it writes into
  }

  Status run() {
    FP_RETURN_IF_ERROR(open_bases());
    Status st = pipeline();
    tasks_.wait();
    if (!st.is_ok()) return output_.settle(st);
    FP_RETURN_IF_ERROR(output_.finish());
    return write_header();
  }

  bool snapshot_signalled() const { return snapshot_signalled_; }

 private:
  const TensorSource& source(size_t slot) const { return (*a_.sources)[file_.tensors[slot]]; }
  bool filled_all() const { return fill_slot_ >= file_.tensors.size(); }

  // The bases of the file's XOR delta candidates (DeltaSource), opened once.
  Status open_bases() {
    bases_.resize(file_.tensors.size());
    if (a_.deltas == nullptr) return Status::ok();
    for (size_t slot = 0; slot < file_.tensors.size(); ++slot) {
      const std::optional<DeltaSource>& d = (*a_.deltas)[file_.tensors[slot]];
      const TensorSource& src = source(slot);
      if (!d || src.nbytes < kMinEncodedTensorBytes) continue;
      ManifestTensor delta;
      delta.name = src.name;
      delta.dtype = src.dtype;
      delta.shape = src.shape;
      delta.length = src.nbytes;
      delta.delta_base = d->base;
      // A base that cannot be opened (gone, its chunk table damaged): no delta, the tensor is
      // stored as without a base.
      auto opened = DeltaBaseBytes::open(delta, d->path);
      if (opened.is_ok()) bases_[slot] = std::move(opened).value();
    }
    return Status::ok();
  }

  Status pipeline() {
    while (true) {
      if (a_.cancel != nullptr && a_.cancel->load(std::memory_order_relaxed)) {
        return Status(StatusCode::kInternal, "cancelled: another data file of this write failed");
      }
      // The snapshot first: stage while windows are free (all of it, without a budget).
      while (!filled_all()) {
        Result<std::unique_ptr<PinnedBuffer>> w = a_.pool->try_acquire();
        if (w.is_ok() && !*w && chunks_.empty()) w = a_.pool->acquire();  // holds none: may wait
        if (!w.is_ok()) return w.status();
        if (!*w) break;
        FP_RETURN_IF_ERROR(fill(std::move(w).value()));
      }
      consider_ahead();
      if (chunks_.empty()) {
        if (filled_all()) return Status::ok();
        continue;
      }
      FP_RETURN_IF_ERROR(emit_front());
    }
  }

  // Stages chunks into `window` until it is full or every tensor is staged.
  Status fill(std::unique_ptr<PinnedBuffer> window) {
    auto hold = std::make_shared<WindowHold>();
    hold->pool = a_.pool;
    hold->window = std::move(window);
    PinnedBuffer& w = *hold->window;
    size_t used = 0;
    while (!filled_all()) {
      const TensorSource& t = source(fill_slot_);
      auto chunk = std::make_unique<Chunk>();
      chunk->slot = fill_slot_;
      chunk->raw_pos = fill_pos_;
      if (t.nbytes > 0) {
        size_t take = static_cast<size_t>(std::min<uint64_t>(chunk_bytes_, t.nbytes - fill_pos_));
        if (used + take > w.size()) break;  // the next window
        StagingHash hash{a_.checksums || a_.digests ? &hash_ : nullptr, &out_->checksum_seconds};
        FP_RETURN_IF_ERROR(
            stage_bytes(t, fill_pos_, take, w, w.data() + used, hash).with_path(a_.path));
        chunk->raw = w.data() + used;
        chunk->raw_bytes = take;
        chunk->window = hold;
        used += take;
        fill_pos_ += take;
      }
      chunks_.push_back(std::move(chunk));
      if (fill_pos_ == t.nbytes) {
        if (a_.checksums) out_->tensors[fill_slot_] = hash_.digest();
        if (a_.digests) out_->digests[fill_slot_] = hash_.digest128();
        hash_.reset();
        ++fill_slot_;
        fill_pos_ = 0;
      }
    }
    if (filled_all() && !snapshot_signalled_) {
      snapshot_signalled_ = true;
      if (a_.on_snapshot_done) a_.on_snapshot_done();
    }
    return Status::ok();
  }

  // Decides, in file order, whether each staged chunk is compressed, and starts those that are,
  // at most max_ahead_ of them not yet emitted.
  void consider_ahead() {
    for (; considered_ < chunks_.size() && compressing_ < max_ahead_; ++considered_) {
      Chunk& c = *chunks_[considered_];
      c.considered = true;
      const TensorOut& t = tensors_[c.slot];
      const bool encodable = c.raw_bytes > 0 && source(c.slot).nbytes >= kMinEncodedTensorBytes;
      // Before the tensor's first chunk is decided, its chunks try every candidate encoding;
      // afterwards only the one chosen.
      c.compress = encodable && a_.compression != Compression::kNone &&
                   (!t.decided || (t.encoding != Compression::kNone && !t.xor_delta));
      c.try_xor = encodable && bases_[c.slot] != nullptr && (!t.decided || t.xor_delta);
      if (!c.compress && !c.try_xor) continue;
      ++compressing_;
      if (c.compress) c.frame = take_buffer(free_frames_, frame_capacity_);
      if (c.try_xor) c.xor_frame = take_buffer(free_xor_frames_, xor_frame_capacity_);
      const size_t width = *safetensors_dtype_size(source(c.slot).dtype);
      const DeltaBaseBytes* base = bases_[c.slot].get();
      tasks_.run([this, &c, width, base] {
        thread_local ChunkCodec codec;
        thread_local std::vector<std::byte> delta;
        auto t0 = std::chrono::steady_clock::now();
        Status st;
        size_t frame_bytes = 0, xor_frame_bytes = 0;
        if (c.compress) {
          Result<size_t> n = codec.encode(a_.compression, a_.compression_level, width, c.raw,
                                          c.raw_bytes, c.frame.get(), frame_capacity_);
          if (n.is_ok())
            frame_bytes = *n;
          else
            st = n.status();
        }
        Status xor_st;
        if (c.try_xor && st.is_ok()) {
          // The base's bytes of this chunk, XORed with the new ones (the staged bytes stay).
          delta.resize(c.raw_bytes);
          xor_st = base->read(c.raw_pos, c.raw_bytes, delta.data());
          if (xor_st.is_ok()) {
            xor_into(delta.data(), c.raw, c.raw_bytes);
            Result<size_t> n = codec.encode(Compression::kZstd, xor_level_, width, delta.data(),
                                            c.raw_bytes, c.xor_frame.get(), xor_frame_capacity_);
            if (n.is_ok())
              xor_frame_bytes = *n;
            else
              xor_st = n.status();
          }
        }
        double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::lock_guard lock(mu_);
        c.frame_bytes = frame_bytes;
        c.xor_frame_bytes = xor_frame_bytes;
        c.xor_status = xor_st;
        c.status = st;
        c.seconds = seconds;
        c.ready = true;
        ready_.notify_all();
      });
    }
  }

  // Appends the oldest chunk to the file (its frame or its raw bytes).
  Status emit_front() {
    Chunk& c = *chunks_.front();
    const bool encoded = c.compress || c.try_xor;
    if (encoded) {
      std::unique_lock lock(mu_);
      ready_.wait(lock, [&] { return c.ready; });
      lock.unlock();
      FP_RETURN_IF_ERROR(Status(c.status).with_path(a_.path));
      out_->compress_seconds += c.seconds;
    }
    TensorOut& t = tensors_[c.slot];
    const TensorSource& src = source(c.slot);
    if (c.raw_pos == 0) {
      t.decided = true;
      t.offset = output_.position();
      // Compressing is worth it when the first chunk shrinks by 5% or more: raw >= 1.05 x
      // frame. An XOR delta, when it is smaller still than what would be stored without it.
      bool shrinks = c.compress && uint64_t{c.frame_bytes} * 105 <= uint64_t{c.raw_bytes} * 100;
      uint64_t otherwise = shrinks ? c.frame_bytes : c.raw_bytes;
      bool delta_shrinks = c.try_xor && c.xor_status.is_ok() &&
                           uint64_t{c.xor_frame_bytes} * 105 <= uint64_t{c.raw_bytes} * 100;
      t.xor_delta = delta_shrinks && c.xor_frame_bytes < otherwise;
      t.encoding = t.xor_delta ? Compression::kZstd : shrinks ? a_.compression : Compression::kNone;
    }
    if (t.xor_delta) {
      // A later chunk whose base bytes could not be read: the delta chosen cannot be finished.
      FP_RETURN_IF_ERROR(c.xor_status);
      FP_RETURN_IF_ERROR(output_.append(c.xor_frame.get(), c.xor_frame_bytes).with_path(a_.path));
      t.frames.push_back(static_cast<uint32_t>(c.xor_frame_bytes));
    } else if (t.encoding != Compression::kNone) {
      FP_RETURN_IF_ERROR(output_.append(c.frame.get(), c.frame_bytes).with_path(a_.path));
      t.frames.push_back(static_cast<uint32_t>(c.frame_bytes));
    } else if (c.raw_bytes > 0) {
      FP_RETURN_IF_ERROR(output_.append(c.raw, c.raw_bytes).with_path(a_.path));
    }
    if (c.raw_pos + c.raw_bytes == src.nbytes && t.encoding != Compression::kNone) {
      const size_t width = *safetensors_dtype_size(src.dtype);
      std::string table =
          encode_chunk_table(t.encoding, chunk_bytes_, static_cast<uint8_t>(width), t.frames);
      FP_RETURN_IF_ERROR(
          output_.append(reinterpret_cast<const std::byte*>(table.data()), table.size())
              .with_path(a_.path));
      t.frames.clear();
      t.frames.shrink_to_fit();
    }
    if (encoded) --compressing_;
    if (c.frame) free_frames_.push_back(std::move(c.frame));
    if (c.xor_frame) free_xor_frames_.push_back(std::move(c.xor_frame));
    chunks_.pop_front();  // may give its window back to the pool
    --considered_;
    return Status::ok();
  }

  static std::unique_ptr<std::byte[]> take_buffer(std::vector<std::unique_ptr<std::byte[]>>& free,
                                                  size_t bytes) {
    if (free.empty()) return std::unique_ptr<std::byte[]>(new std::byte[bytes]);
    std::unique_ptr<std::byte[]> b = std::move(free.back());
    free.pop_back();
    return b;
  }

  // The header's "fastpersist.encoding": the file's codec, and "xor-zstd" when it holds deltas.
  std::string file_encoding() const {
    const bool deltas = std::any_of(tensors_.begin(), tensors_.end(),
                                    [](const TensorOut& t) { return t.xor_delta; });
    if (a_.compression == Compression::kNone)
      return deltas ? std::string(kEncodingXorZstd) : "none";
    std::string name(compression_name(a_.compression));
    return deltas ? name + "," + std::string(kEncodingXorZstd) : name;
  }

  // The real header, padded into the room reserved for it, written at offset 0.
  Status write_header() {
    const uint64_t data_start = file_.encoded_header_bytes;
    std::vector<SafetensorsEntry> entries;
    entries.reserve(file_.tensors.size());
    out_->stored.resize(file_.tensors.size());
    const uint64_t end = output_.position();
    for (size_t k = 0; k < file_.tensors.size(); ++k) {
      const TensorSource& src = source(k);
      uint64_t next = k + 1 < file_.tensors.size() ? tensors_[k + 1].offset : end;
      ShardFileOutcome::Stored& s = out_->stored[k];
      s.offset = tensors_[k].offset;
      s.length = next - s.offset;
      s.encoding = tensors_[k].encoding;
      s.xor_delta = tensors_[k].xor_delta;
      if (s.encoding == Compression::kNone) {
        entries.push_back({src.name, src.dtype, src.shape});
      } else {
        entries.push_back({src.name, "U8", {s.length}});
      }
    }
    SafetensorsHeader layout;
    FP_ASSIGN_OR_RETURN(
        std::string header,
        encode_safetensors_header(
            entries, {{"format", "pt"}, {"fastpersist.encoding", file_encoding()}}, 8, &layout));
    for (size_t k = 0; k < entries.size(); ++k) {
      if (data_start + layout.tensors[k].begin != out_->stored[k].offset) {
        return Status(StatusCode::kInternal, "encoded file layout disagrees with its header")
            .with_path(a_.path);
      }
    }
    FP_ASSIGN_OR_RETURN(header, pad_safetensors_header(std::move(header), data_start));
    out_->header = a_.checksums ? xxh3_64(header.data(), header.size()) : 0;
    out_->data_start = data_start;
    out_->file_size = end;
    FP_ASSIGN_OR_RETURN(PinnedBuffer buffer, PinnedBuffer::allocate(header.size(), false, false));
    std::memcpy(buffer.data(), header.data(), header.size());
    IoRequest req;
    req.kind = IoKind::kWrite;
    req.buffer = buffer.data();
    req.length = header.size();
    req.fd = fd_;
    req.file_offset = 0;
    FP_ASSIGN_OR_RETURN(IoTicket ticket, a_.engine->start(req));
    return ticket.wait().status();
  }

  const ShardWriteArgs& a_;
  const PlannedFile& file_;
  ShardFileOutcome* out_;
  const int fd_;
  const uint32_t chunk_bytes_;
  const size_t frame_capacity_;
  const size_t xor_frame_capacity_;
  const int xor_level_;
  const size_t max_ahead_;
  TaskGroup tasks_;
  OutputStream output_;
  std::vector<TensorOut> tensors_;
  std::vector<std::shared_ptr<const DeltaBaseBytes>> bases_;  // per slot: XOR delta candidates

  // Staging.
  size_t fill_slot_ = 0;
  uint64_t fill_pos_ = 0;
  Xxh3Stream hash_;
  bool snapshot_signalled_ = false;

  // Staged, not yet emitted, in file order; the first considered_ have been considered.
  std::deque<std::unique_ptr<Chunk>> chunks_;
  size_t considered_ = 0;
  size_t compressing_ = 0;
  std::vector<std::unique_ptr<std::byte[]>> free_frames_;
  std::vector<std::unique_ptr<std::byte[]>> free_xor_frames_;
  std::mutex mu_;
  std::condition_variable ready_;
};

}  // namespace

Status write_encoded_file(const ShardWriteArgs& a, ShardFileOutcome* out) {
  FP_ASSIGN_OR_RETURN(UniqueFd fd, create_data_file(a, out));
  bool signalled = false;
  Status st;
  {
    EncodedWriter writer(a, out, fd.get());
    st = writer.run();
    signalled = writer.snapshot_signalled();
  }
  if (!st.is_ok()) return st.with_path(a.path);
  if (!signalled && a.on_snapshot_done) a.on_snapshot_done();
  if (a.durable && ::fdatasync(fd.get()) != 0) {
    return Status::from_errno(errno, "fdatasync failed").with_path(a.path);
  }
  if (::close(fd.release()) != 0)
    return Status::from_errno(errno, "close failed").with_path(a.path);
  return Status::ok();
}

}  // namespace fastpersist::checkpoint
