// SPDX-License-Identifier: Apache-2.0
#include "fastpersist/io_engine.h"

#include <atomic>
#include <vector>

#include "io/engine_internal.h"
#include "io/io_worker.h"
#include "io/open_file.h"
#include "io/transfer_plan.h"

namespace fastpersist {

void IoTicket::State::slice_done(const Status& status) {
  std::lock_guard lock(mu);
  if (!status.is_ok() && error.is_ok()) error = status;
  if (--slices_left == 0) {
    finished = true;
    file.reset();
    ++counters->requests;
    cv.notify_all();
  }
}

bool IoTicket::done() const {
  if (!state_) return true;
  std::lock_guard lock(state_->mu);
  return state_->finished;
}

Result<uint64_t> IoTicket::wait() const {
  if (!state_) return Status(StatusCode::kInvalidArgument, "waiting on an empty ticket");
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->finished; });
  if (!state_->error.is_ok()) return state_->error;
  return state_->length;
}

struct IoEngine::Impl {
  EngineOptions options;
  std::string backend_name;
  std::string backend_reason;
  std::shared_ptr<io::EngineCounters> counters = std::make_shared<io::EngineCounters>();
  std::vector<std::unique_ptr<io::IoWorker>> workers;
  std::atomic<unsigned> next_worker{0};
  mutable std::mutex mu;
  std::vector<IoTicket> uncollected;

  Result<IoTicket> start(const IoRequest& r);
};

Result<std::unique_ptr<IoEngine>> IoEngine::create(const EngineOptions& options) {
  FP_RETURN_IF_ERROR(options.validate());
  std::string why;
  FP_ASSIGN_OR_RETURN(Backend backend, resolve_backend(options.backend, &why));
  FP_ASSIGN_OR_RETURN(BackendFactory factory, backend_factory(backend));
  EngineOptions resolved = options;
  resolved.backend = backend;
  FP_ASSIGN_OR_RETURN(auto engine, create(resolved, std::move(factory),
                                          std::string(fastpersist::backend_name(backend))));
  engine->impl_->backend_reason = why;
  return engine;
}

Result<std::unique_ptr<IoEngine>> IoEngine::create(const EngineOptions& options,
                                                   BackendFactory factory, std::string name) {
  FP_RETURN_IF_ERROR(options.validate());
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->backend_name = std::move(name);
  impl->backend_reason = impl->backend_name + " supplied by the caller";
  for (unsigned i = 0; i < options.intra_op_parallelism; ++i) {
    FP_ASSIGN_OR_RETURN(auto backend, factory(options.queue_depth));
    impl->workers.push_back(
        std::make_unique<io::IoWorker>(std::move(backend), options, impl->counters));
  }
  return std::unique_ptr<IoEngine>(new IoEngine(std::move(impl)));
}

IoEngine::IoEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

IoEngine::~IoEngine() = default;  // workers drain their queues before joining

const EngineOptions& IoEngine::options() const { return impl_->options; }
const std::string& IoEngine::backend_name() const { return impl_->backend_name; }
const std::string& IoEngine::backend_reason() const { return impl_->backend_reason; }

Result<IoTicket> IoEngine::Impl::start(const IoRequest& r) {
  if (r.memory != MemoryKind::kHost) {
    // Checked before the file is opened, so a refused request changes nothing on disk (no
    // file created, none truncated).
    return Status(StatusCode::kInvalidArgument,
                  "the buffer is in the memory of CUDA device " + std::to_string(r.device) +
                      ", and the " + backend_name +
                      " engine moves host memory only (its bounce copies and the kernel would "
                      "read it as host memory); stage it through pinned host memory "
                      "(AioHandle does) or use GdsHandle (cuFile)")
        .with_path(r.fd >= 0 ? "fd " + std::to_string(r.fd) : r.path)
        .with_range(r.file_offset, r.length);
  }
  if (r.buffer == nullptr && r.length > 0) {
    return Status(StatusCode::kInvalidArgument,
                  "buffer is null but length is " + std::to_string(r.length));
  }
  if (r.file_offset > UINT64_MAX - r.length || r.file_offset + r.length > uint64_t{INT64_MAX}) {
    return Status(StatusCode::kInvalidArgument, "file offset + length overflows");
  }
  if (r.truncate && (r.kind != IoKind::kWrite || r.fd >= 0)) {
    return Status(StatusCode::kInvalidArgument,
                  "truncate applies only to writes by path (a caller's descriptor is never "
                  "truncated)");
  }
  bool want_direct = options.direct_io && r.length >= options.direct_io_min_bytes;
  FP_ASSIGN_OR_RETURN(std::shared_ptr<io::OpenFile> file, io::open_for_request(r, want_direct));
  if (want_direct && !file->direct_fd.valid()) {
    ++counters->direct_fallbacks;
    std::lock_guard lock(counters->mu);
    counters->last_fallback_reason = file->path + ": " + file->mode.fallback_reason;
  }

  auto state = std::make_shared<IoTicket::State>();
  state->kind = r.kind;
  state->length = r.length;
  state->counters = counters;
  std::vector<io::Slice> slices = io::split_into_slices(
      r.file_offset, r.length, static_cast<unsigned>(workers.size()), file->split_alignment);
  if (slices.empty()) {
    state->finished = true;
    ++counters->requests;
    return IoTicket(state);
  }
  state->slices_left = static_cast<unsigned>(slices.size());
  state->file = file;

  io::SegmentRules rules;
  rules.direct = file->direct_fd.valid();
  rules.split_alignment = file->split_alignment;
  rules.memory_alignment = file->mode.memory_alignment;
  rules.buffer_address = reinterpret_cast<uintptr_t>(r.buffer);
  unsigned first = next_worker.fetch_add(1) % static_cast<unsigned>(workers.size());
  for (size_t i = 0; i < slices.size(); ++i) {
    io::SliceTask task;
    task.ticket = state;
    task.file = file;
    task.buffer = r.buffer;
    task.is_write = r.kind == IoKind::kWrite;
    task.segments = io::plan_segments(slices[i], rules);
    workers[(first + i) % workers.size()]->enqueue(std::move(task));
  }
  return IoTicket(state);
}

Result<IoTicket> IoEngine::submit(const IoRequest& request) {
  FP_ASSIGN_OR_RETURN(IoTicket ticket, impl_->start(request));
  std::lock_guard lock(impl_->mu);
  impl_->uncollected.push_back(ticket);
  return ticket;
}

Result<IoTicket> IoEngine::start(const IoRequest& request) { return impl_->start(request); }

Result<uint64_t> IoEngine::run(const IoRequest& request) {
  FP_ASSIGN_OR_RETURN(IoTicket ticket, impl_->start(request));
  return ticket.wait();
}

Result<size_t> IoEngine::wait() {
  std::vector<IoTicket> tickets;
  {
    std::lock_guard lock(impl_->mu);
    tickets.swap(impl_->uncollected);
  }
  Status first_error;
  for (const IoTicket& t : tickets) {
    Result<uint64_t> r = t.wait();
    if (!r.is_ok() && first_error.is_ok()) first_error = r.status();
  }
  if (!first_error.is_ok()) return first_error;
  return tickets.size();
}

size_t IoEngine::pending() const {
  std::lock_guard lock(impl_->mu);
  return impl_->uncollected.size();
}

IoStats IoEngine::stats() const {
  const io::EngineCounters& c = *impl_->counters;
  IoStats s;
  s.requests = c.requests;
  s.bytes_written = c.bytes_written;
  s.bytes_read = c.bytes_read;
  s.direct_bytes = c.direct_bytes;
  s.buffered_bytes = c.buffered_bytes;
  s.bounce_bytes = c.bounce_bytes;
  s.short_transfers = c.short_transfers;
  s.direct_fallbacks = c.direct_fallbacks;
  std::lock_guard lock(impl_->counters->mu);
  s.last_fallback_reason = c.last_fallback_reason;
  return s;
}

}  // namespace fastpersist
