// SPDX-License-Identifier: Apache-2.0
#include "handle/device_staging.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <memory>
#include <vector>

#include "buffer/device_copy.h"

namespace fastpersist::handle {
namespace {

constexpr uint64_t kPage = 4096;
constexpr size_t kMinChunk = size_t{4} << 20;
constexpr size_t kMaxChunk = size_t{64} << 20;

Status check_read_range(const StagedTransfer& t) {
  struct stat st {};
  int rc = t.fd >= 0 ? ::fstat(t.fd, &st) : ::stat(t.path.c_str(), &st);
  std::string name = t.fd >= 0 ? "fd " + std::to_string(t.fd) : t.path;
  if (rc != 0) return Status::from_errno(errno, "cannot open file for reading").with_path(name);
  uint64_t end = t.file_offset + t.memory.bytes;
  if (S_ISREG(st.st_mode) && end > static_cast<uint64_t>(st.st_size)) {
    return Status(StatusCode::kOutOfRange, "read past the end of the file (the file has " +
                                               std::to_string(st.st_size) + " bytes)")
        .with_path(name)
        .with_range(t.file_offset, t.memory.bytes);
  }
  return Status::ok();
}

IoRequest chunk_request(const StagedTransfer& t, const StagingChunk& c, std::byte* slot,
                        bool first) {
  IoRequest r;
  r.kind = t.kind;
  r.buffer = slot + c.slot_offset;
  r.length = c.length;
  r.path = t.path;
  r.fd = t.fd;
  r.file_offset = c.file_offset;
  r.truncate = t.truncate && first;  // emptied once, when the first chunk is submitted
  return r;
}

Status with_context(const StagedTransfer& t, Status st) {
  if (st.is_ok()) return st;
  return Status(st.code(),
                "staging " + std::to_string(t.memory.bytes) + " bytes of CUDA device " +
                    std::to_string(t.memory.device) +
                    " memory through pinned host memory: " + st.message(),
                st.sys_errno())
      .with_path(st.path().empty() ? (t.fd >= 0 ? "fd " + std::to_string(t.fd) : t.path)
                                   : st.path())
      .with_range(st.offset().value_or(t.file_offset), st.length().value_or(t.memory.bytes));
}

class Pipeline {
 public:
  Pipeline(IoEngine& engine, const StagedTransfer& t) : engine_(engine), t_(t) {}

  Status prepare(PinnedBufferPool& pool, size_t slot_bytes, size_t slots) {
    // Selects the device on this thread first, so that the slots' CUDA registration (when the
    // pool allocates them) goes to its context and no other device's.
    FP_RETURN_IF_ERROR(buffer::finish_copies(t_.memory.device));
    for (size_t i = 0; i < slots; ++i) {
      FP_ASSIGN_OR_RETURN(auto slot, pool.acquire(slot_bytes));
      FP_RETURN_IF_ERROR(buffer::prepare_copy_target(*slot, t_.memory.device));
      slots_.push_back(std::move(slot));
    }
    tickets_.resize(slots);
    return Status::ok();
  }

  Status write(const std::vector<StagingChunk>& chunks) {
    for (size_t k = 0; k < chunks.size(); ++k) {
      size_t s = k % slots_.size();
      FP_RETURN_IF_ERROR(collect(s));  // the slot's previous write must be done
      const StagingChunk& c = chunks[k];
      std::byte* dst = slots_[s]->data() + c.slot_offset;
      FP_RETURN_IF_ERROR(buffer::start_copy_from_device(dst, t_.memory.data + c.memory_offset,
                                                        c.length, t_.memory.device));
      FP_RETURN_IF_ERROR(buffer::finish_copies(t_.memory.device));
      FP_ASSIGN_OR_RETURN(tickets_[s],
                          engine_.start(chunk_request(t_, c, slots_[s]->data(), k == 0)));
    }
    return Status::ok();
  }

  Status read(const std::vector<StagingChunk>& chunks) {
    size_t next = 0;  // next chunk to read
    auto submit = [&](size_t s) -> Status {
      if (next >= chunks.size()) return Status::ok();
      FP_ASSIGN_OR_RETURN(tickets_[s],
                          engine_.start(chunk_request(t_, chunks[next], slots_[s]->data(), false)));
      ++next;
      return Status::ok();
    };
    for (size_t s = 0; s < slots_.size(); ++s) FP_RETURN_IF_ERROR(submit(s));
    for (size_t k = 0; k < chunks.size(); ++k) {
      size_t s = k % slots_.size();
      FP_RETURN_IF_ERROR(collect(s));
      const StagingChunk& c = chunks[k];
      FP_RETURN_IF_ERROR(buffer::start_copy_to_device(t_.memory.data + c.memory_offset,
                                                      slots_[s]->data() + c.slot_offset, c.length,
                                                      t_.memory.device));
      // The slot is read into again next: its copy must have left it.
      FP_RETURN_IF_ERROR(buffer::finish_copies(t_.memory.device));
      FP_RETURN_IF_ERROR(submit(s));
    }
    return Status::ok();
  }

  // Waits for every request still in flight (their slots go back to the pool afterwards only).
  Status drain() {
    Status first;
    for (size_t s = 0; s < tickets_.size(); ++s) {
      Status st = collect(s);
      if (first.is_ok()) first = st;
    }
    return first;
  }

 private:
  Status collect(size_t s) {
    if (!tickets_[s].valid()) return Status::ok();
    Result<uint64_t> done = tickets_[s].wait();
    tickets_[s] = IoTicket();
    return done.status();
  }

  IoEngine& engine_;
  const StagedTransfer& t_;
  std::vector<std::shared_ptr<PinnedBuffer>> slots_;
  std::vector<IoTicket> tickets_;
};

}  // namespace

std::vector<StagingChunk> plan_staging_chunks(uint64_t file_offset, uint64_t length,
                                              uint64_t chunk) {
  std::vector<StagingChunk> out;
  if (chunk < kPage) chunk = kPage;  // a chunk must hold at least the first page's remainder
  uint64_t done = 0;
  while (done < length) {
    uint64_t at = file_offset + done;
    uint64_t head = at % kPage;
    uint64_t take = std::min(chunk - head, length - done);
    out.push_back({at, take, done, head});
    done += take;
  }
  return out;
}

size_t staging_chunk_bytes(const EngineOptions& options) {
  size_t want = options.block_size * std::max(1u, options.intra_op_parallelism);
  want = (want + kPage - 1) / kPage * kPage;
  return std::clamp(want, kMinChunk, kMaxChunk);
}

Status run_staged_transfer(IoEngine& engine, PinnedBufferPool& pool, const StagedTransfer& t) {
  if (t.memory.kind != MemoryKind::kCudaDevice || t.memory.device < 0) {
    return Status(StatusCode::kInternal, "run_staged_transfer called with host memory");
  }
  if (t.memory.bytes == 0) {
    // No bytes to stage, but the same open, creation and truncation as for host memory.
    IoRequest r;
    r.kind = t.kind;
    r.path = t.path;
    r.fd = t.fd;
    r.file_offset = t.file_offset;
    r.truncate = t.truncate;
    return with_context(t, engine.run(r).status());
  }
  if (t.kind == IoKind::kRead) FP_RETURN_IF_ERROR(with_context(t, check_read_range(t)));
  const uint64_t chunk = staging_chunk_bytes(engine.options());
  std::vector<StagingChunk> chunks = plan_staging_chunks(t.file_offset, t.memory.bytes, chunk);
  // A chunk and its offset into its first page never exceed `chunk` (plan_staging_chunks).
  const size_t slot_bytes = static_cast<size_t>(std::min<uint64_t>(chunk, t.memory.bytes + kPage));
  const size_t slots = std::min<size_t>(kStagingSlots, chunks.size());
  Pipeline pipeline(engine, t);
  Status st = pipeline.prepare(pool, slot_bytes, slots);
  if (st.is_ok()) st = t.kind == IoKind::kWrite ? pipeline.write(chunks) : pipeline.read(chunks);
  Status drained = pipeline.drain();  // never return while the engine still uses a slot
  if (st.is_ok()) st = drained;
  return with_context(t, std::move(st));
}

}  // namespace fastpersist::handle
