// SPDX-License-Identifier: Apache-2.0
// The worker loop: admit slices, generate block operations, submit, reap, check every
// completion, resume short transfers, finish slices. One loop per worker thread.
#include "io/io_worker.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/align.h"

namespace fastpersist::io {
namespace {

// Aligned scratch memory for O_DIRECT transfers whose buffer address is misaligned.
constexpr uint64_t kBounceBudgetBytes = uint64_t{64} << 20;
constexpr uint64_t kMinBounceSlotBytes = uint64_t{1} << 20;
constexpr uint64_t kBounceAlignment = 4096;

class BouncePool {
 public:
  BouncePool(uint64_t block_size, unsigned capacity)
      : slot_bytes_(
            align_up(std::max<uint64_t>(block_size, kMinBounceSlotBytes), kBounceAlignment)),
        // At least two slots so copying overlaps I/O, but never more than the queue can use;
        // not std::clamp: with a queue depth of 1 its bounds would be reversed (undefined).
        max_slots_(static_cast<unsigned>(std::min<uint64_t>(
            std::max<uint64_t>(kBounceBudgetBytes / slot_bytes_, 2), capacity))) {}
  ~BouncePool() {
    for (std::byte* p : all_) std::free(p);
  }
  BouncePool(const BouncePool&) = delete;
  BouncePool& operator=(const BouncePool&) = delete;

  uint64_t slot_bytes() const { return slot_bytes_; }
  // A free slot, or nullptr when all are in use (or memory ran out).
  std::byte* acquire() {
    if (!free_.empty()) {
      std::byte* p = free_.back();
      free_.pop_back();
      return p;
    }
    if (all_.size() >= max_slots_) return nullptr;
    void* p = std::aligned_alloc(kBounceAlignment, slot_bytes_);
    if (p == nullptr) return nullptr;
    all_.push_back(static_cast<std::byte*>(p));
    return all_.back();
  }
  void release(std::byte* p) { free_.push_back(p); }
  bool any_in_use() const { return free_.size() < all_.size(); }

 private:
  uint64_t slot_bytes_;
  unsigned max_slots_;
  std::vector<std::byte*> all_;
  std::vector<std::byte*> free_;
};

}  // namespace

struct IoWorker::Active {
  explicit Active(SliceTask t) : task(std::move(t)) {}
  SliceTask task;
  size_t segment = 0;        // next segment to generate operations from
  uint64_t segment_pos = 0;  // bytes of that segment already generated
  unsigned outstanding = 0;  // operations generated and not yet finished
  Status error;
  bool generation_done() const { return !error.is_ok() || segment >= task.segments.size(); }
};

struct IoWorker::Inflight {
  Active* slice = nullptr;
  IoOp op;                   // what is (re)submitted: the not-yet-transferred rest
  uint64_t file_offset = 0;  // the whole operation
  uint64_t length = 0;
  std::byte* user = nullptr;    // where the bytes live in the caller's buffer
  std::byte* bounce = nullptr;  // aligned scratch copy, or nullptr
  uint64_t done = 0;
};

class IoWorker::Loop {
 public:
  explicit Loop(IoWorker& w)
      : w_(w),
        backend_(*w.backend_),
        slots_(backend_.capacity()),
        completions_(backend_.capacity()),
        bounce_(w.options_.block_size, backend_.capacity()) {
    for (unsigned i = backend_.capacity(); i > 0; --i) free_slots_.push_back(i - 1);
  }

  void run() {
    for (;;) {
      if (!admit()) return;
      bool may_generate = w_.options_.overlap_events || inflight_ == 0;
      batch_.clear();
      for (uint32_t tag : resubmit_) batch_.push_back(slots_[tag].op);
      resubmit_.clear();
      if (may_generate) generate();
      submit();
      reap();
      finish_slices();
    }
  }

 private:
  // Takes queued slices; blocks when idle. False when the worker should exit.
  bool admit() {
    std::unique_lock lock(w_.mu_);
    if (active_.empty() && inflight_ == 0) {
      w_.cv_.wait(lock, [&] { return w_.stop_ || !w_.queue_.empty(); });
      if (w_.queue_.empty()) return false;
    }
    while (!w_.queue_.empty()) {
      active_.push_back(std::make_unique<Active>(std::move(w_.queue_.front())));
      w_.queue_.pop_front();
      if (!broken_.is_ok()) active_.back()->error = broken_;
    }
    return true;
  }

  void generate() {
    for (auto& a : active_) {
      while (!a->generation_done() && !free_slots_.empty()) {
        const OpenFile& file = *a->task.file;
        const Segment& seg = a->task.segments[a->segment];
        bool direct = seg.kind != SegmentKind::kBuffered;
        bool bounced = seg.kind == SegmentKind::kDirectBounce;
        uint64_t chunk = w_.options_.block_size;
        if (direct) chunk = std::max(file.split_alignment, align_down(chunk, file.split_alignment));
        if (bounced)
          chunk = std::min(chunk, align_down(bounce_.slot_bytes(), file.split_alignment));
        if (chunk == 0) {  // alignment larger than a bounce slot: go through the page cache
          direct = bounced = false;
          chunk = w_.options_.block_size;
        }
        uint64_t len = std::min(chunk, seg.length - a->segment_pos);
        std::byte* scratch = nullptr;
        if (bounced) {
          scratch = bounce_.acquire();
          if (scratch == nullptr) {
            if (!bounce_.any_in_use()) {  // not even one slot: out of memory
              a->error =
                  Status(StatusCode::kIoError, "cannot allocate aligned bounce memory", ENOMEM);
              continue;
            }
            return;  // wait for a completion to return a slot
          }
        }
        uint32_t tag = free_slots_.back();
        free_slots_.pop_back();
        Inflight& f = slots_[tag];
        f.slice = a.get();
        f.file_offset = seg.file_offset + a->segment_pos;
        f.length = len;
        f.user = a->task.buffer + seg.buffer_offset + a->segment_pos;
        f.bounce = scratch;
        f.done = 0;
        if (scratch != nullptr && a->task.is_write) std::memcpy(scratch, f.user, len);
        f.op = IoOp{direct ? file.direct_fd.get() : file.buffered_fd.get(),
                    scratch != nullptr ? scratch : f.user,
                    len,
                    f.file_offset,
                    a->task.is_write,
                    tag};
        batch_.push_back(f.op);
        ++a->outstanding;
        a->segment_pos += len;
        if (a->segment_pos == seg.length) {
          ++a->segment;
          a->segment_pos = 0;
        }
      }
      if (free_slots_.empty()) return;
    }
  }

  void submit() {
    size_t i = 0;
    while (i < batch_.size()) {
      size_t want = w_.options_.single_submit ? 1 : batch_.size() - i;
      size_t accepted = 0;
      Status st = backend_.submit(std::span<const IoOp>(batch_.data() + i, want), &accepted);
      inflight_ += static_cast<unsigned>(accepted);
      i += accepted;
      if (!st.is_ok()) {
        // The queue is unusable; fail what it did not take and every later slice.
        broken_ = Status(st.code(), "I/O submission failed: " + st.message(), st.sys_errno());
        for (; i < batch_.size(); ++i) fail_op(static_cast<uint32_t>(batch_[i].tag), broken_);
        return;
      }
    }
  }

  void reap() {
    if (inflight_ == 0) return;
    size_t min = w_.options_.overlap_events ? 1 : inflight_;
    Result<size_t> n = backend_.reap(completions_, min);
    if (!n.is_ok()) {
      // Without completions we cannot know which operations are still running; the only safe
      // answer is to report failure for everything this worker holds.
      broken_ = Status(n.status().code(), "I/O completion failed: " + n.status().message(),
                       n.status().sys_errno());
      for (uint32_t tag = 0; tag < slots_.size(); ++tag) {
        if (slots_[tag].slice != nullptr) fail_op(tag, broken_);
      }
      inflight_ = 0;
      return;
    }
    for (size_t k = 0; k < *n; ++k) {
      --inflight_;
      complete(static_cast<uint32_t>(completions_[k].tag), completions_[k].result);
    }
  }

  void complete(uint32_t tag, int64_t res) {
    Inflight& f = slots_[tag];
    Active& a = *f.slice;
    const OpenFile& file = *a.task.file;
    const bool write = a.task.is_write;
    const uint64_t want = f.length - f.done;
    if (res < 0) {
      fail_op(tag,
              Status::from_errno(static_cast<int>(-res), write ? "write failed" : "read failed")
                  .with_path(file.path)
                  .with_range(f.file_offset + f.done, want));
      return;
    }
    auto got = static_cast<uint64_t>(res);
    if (got == 0 || got > want) {
      Status st =
          got > want ? Status(StatusCode::kInternal, "the kernel reported more bytes than asked")
          : write    ? Status(StatusCode::kIoError, "write made no progress (0 bytes written)", EIO)
                     : Status(StatusCode::kOutOfRange,
                              "unexpected end of file: the file is shorter than when the "
                                 "request started");
      fail_op(tag, std::move(st).with_path(file.path).with_range(f.file_offset + f.done, want));
      return;
    }
    bool was_direct = f.op.fd == file.direct_fd.get() && file.direct_fd.valid();
    (was_direct ? w_.counters_->direct_bytes : w_.counters_->buffered_bytes) += got;
    f.done += got;
    if (f.done < f.length) {
      ++w_.counters_->short_transfers;
      std::byte* base = f.bounce != nullptr ? f.bounce : f.user;
      f.op.buffer = base + f.done;
      f.op.length = f.length - f.done;
      f.op.file_offset = f.file_offset + f.done;
      // An O_DIRECT transfer resumed at an unaligned point must finish through the page cache.
      if (was_direct && !(is_aligned(f.op.file_offset, file.mode.offset_alignment) &&
                          is_aligned(f.op.length, file.mode.offset_alignment) &&
                          is_aligned(f.op.buffer, file.mode.memory_alignment))) {
        f.op.fd = file.buffered_fd.get();
      }
      resubmit_.push_back(tag);
      return;
    }
    if (f.bounce != nullptr) {
      if (!write) std::memcpy(f.user, f.bounce, f.length);
      w_.counters_->bounce_bytes += f.length;
    }
    (write ? w_.counters_->bytes_written : w_.counters_->bytes_read) += f.length;
    release(tag);
  }

  void fail_op(uint32_t tag, Status st) {
    Active& a = *slots_[tag].slice;
    if (a.error.is_ok()) a.error = std::move(st);
    release(tag);
  }

  void release(uint32_t tag) {
    Inflight& f = slots_[tag];
    --f.slice->outstanding;
    if (f.bounce != nullptr) bounce_.release(f.bounce);
    f = Inflight{};
    free_slots_.push_back(tag);
  }

  void finish_slices() {
    for (auto it = active_.begin(); it != active_.end();) {
      Active& a = **it;
      // A slice with resubmissions pending still has them counted in `outstanding`.
      if (a.generation_done() && a.outstanding == 0) {
        auto ticket = std::move(a.task.ticket);
        Status st = std::move(a.error);
        it = active_.erase(it);
        ticket->slice_done(st);
      } else {
        ++it;
      }
    }
  }

  IoWorker& w_;
  IoBackend& backend_;
  std::vector<Inflight> slots_;
  std::vector<uint32_t> free_slots_;
  std::vector<IoCompletion> completions_;
  std::vector<IoOp> batch_;
  std::vector<uint32_t> resubmit_;
  std::deque<std::unique_ptr<Active>> active_;
  BouncePool bounce_;
  unsigned inflight_ = 0;
  Status broken_;
};

IoWorker::IoWorker(std::unique_ptr<IoBackend> backend, const EngineOptions& options,
                   std::shared_ptr<EngineCounters> counters)
    : backend_(std::move(backend)), options_(options), counters_(std::move(counters)) {
  thread_ = std::thread([this] { run(); });
}

IoWorker::~IoWorker() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void IoWorker::enqueue(SliceTask task) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void IoWorker::run() { Loop(*this).run(); }

}  // namespace fastpersist::io
