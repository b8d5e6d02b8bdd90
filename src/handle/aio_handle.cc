// SPDX-License-Identifier: Apache-2.0
#include "fastpersist/aio_handle.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "common/unique_fd.h"
#include "handle/device_requests.h"

namespace fastpersist {
namespace {

constexpr size_t kHandleAlignment = 4096;
constexpr size_t kValidateChunk = size_t{4} << 20;

// Re-reads [offset, offset + bytes) through the page cache and compares it with `expected`.
Status compare_with_file(const std::byte* expected, size_t bytes, const std::string& path, int fd,
                         uint64_t offset) {
  UniqueFd own;
  if (fd < 0) {
    own.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!own.valid())
      return Status::from_errno(errno, "validate: cannot reopen file").with_path(path);
    fd = own.get();
  }
  std::vector<std::byte> chunk(std::min(bytes, kValidateChunk));
  size_t done = 0;
  while (done < bytes) {
    size_t want = std::min(chunk.size(), bytes - done);
    ssize_t n = ::pread(fd, chunk.data(), want, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return Status(
                 StatusCode::kIoError,
                 n < 0 ? "validate: re-read failed" : "validate: file is shorter than the buffer",
                 n < 0 ? errno : 0)
          .with_path(path.empty() ? "fd " + std::to_string(fd) : path)
          .with_range(offset + done, want);
    }
    if (std::memcmp(chunk.data(), expected + done, static_cast<size_t>(n)) != 0) {
      size_t i = 0;
      while (chunk[i] == expected[done + i]) ++i;
      return Status(StatusCode::kIoError, "validate: file content differs from the buffer", EIO)
          .with_path(path.empty() ? "fd " + std::to_string(fd) : path)
          .with_range(offset + done + i, 1);
    }
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

}  // namespace

struct AioHandle::Impl {
  // A request submitted with `validate`, compared with the file once it finished.
  struct Validation {
    bool is_write;
    const std::byte* buffer;
    size_t bytes;
    std::string path;
    int fd;
    uint64_t offset;
    IoTicket ticket;
  };

  explicit Impl(std::unique_ptr<IoEngine> e)
      : engine(std::move(e)), device(std::make_unique<handle::DeviceRequests>(*engine, pool)) {}

  Result<int> start(const IoRequest& request, bool validate, bool async_op);
  Result<int> start_device(const IoRequest& request, bool validate, bool async_op);
  Result<int> wait();
  Status run_validations(std::vector<Validation> checks);

  std::unique_ptr<IoEngine> engine;
  PinnedBufferPool pool;
  mutable std::mutex mu;  // guards pending_validations and locked
  std::vector<Validation> pending_validations;
  std::vector<std::shared_ptr<PinnedBuffer>> locked;
  // Declared last, so destroyed first: its thread finishes staging (with the engine and the
  // pool above) before they go.
  std::unique_ptr<handle::DeviceRequests> device;
};

Result<std::unique_ptr<AioHandle>> AioHandle::create(const EngineOptions& options) {
  FP_ASSIGN_OR_RETURN(auto engine, IoEngine::create(options));
  return std::unique_ptr<AioHandle>(new AioHandle(std::make_unique<Impl>(std::move(engine))));
}

AioHandle::AioHandle(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

AioHandle::~AioHandle() {
  (void)impl_->device->wait();
  (void)impl_->engine->wait();
}

IoEngine& AioHandle::engine() { return *impl_->engine; }

size_t AioHandle::get_block_size() const { return impl_->engine->options().block_size; }
unsigned AioHandle::get_queue_depth() const { return impl_->engine->options().queue_depth; }
bool AioHandle::get_single_submit() const { return impl_->engine->options().single_submit; }
bool AioHandle::get_overlap_events() const { return impl_->engine->options().overlap_events; }
unsigned AioHandle::get_intra_op_parallelism() const {
  return impl_->engine->options().intra_op_parallelism;
}
size_t AioHandle::get_alignment() const { return kHandleAlignment * get_intra_op_parallelism(); }

Result<int> AioHandle::Impl::start(const IoRequest& request, bool validate, bool async_op) {
  if (request.memory != MemoryKind::kHost) return start_device(request, validate, async_op);
  if (async_op) {
    FP_ASSIGN_OR_RETURN(IoTicket ticket, engine->submit(request));
    if (validate) {
      std::lock_guard lock(mu);
      pending_validations.push_back({request.kind == IoKind::kWrite, request.buffer,
                                     static_cast<size_t>(request.length), request.path, request.fd,
                                     request.file_offset, ticket});
    }
    return 0;
  }
  // A sync request is started outside the engine's wait() list: only this call waits for it
  // and counts it, so a wait() racing on another thread can neither collect nor count it twice.
  // The wait() below drains the earlier async requests, as DeepNVMe's sync calls do.
  FP_ASSIGN_OR_RETURN(IoTicket ticket, engine->start(request));
  Result<int> drained = wait();
  Result<uint64_t> own = ticket.wait();
  if (!own.is_ok()) return own.status();
  if (validate) {
    FP_RETURN_IF_ERROR(compare_with_file(request.buffer, static_cast<size_t>(request.length),
                                         request.path, request.fd, request.file_offset));
  }
  if (!drained.is_ok()) return drained.status();
  return *drained + 1;
}

// Everything is checked before the request is queued, so a refused call changes nothing.
Result<int> AioHandle::Impl::start_device(const IoRequest& request, bool validate, bool async_op) {
  auto where = [&] { return request.fd >= 0 ? "fd " + std::to_string(request.fd) : request.path; };
  if (validate) {
    return Status(StatusCode::kInvalidArgument,
                  "validate compares the file with the buffer in host memory; the buffer is in "
                  "the memory of CUDA device " +
                      std::to_string(request.device))
        .with_path(where());
  }
  if (request.truncate && request.fd >= 0) {
    return Status(StatusCode::kInvalidArgument,
                  "truncate applies only to writes by path (a caller's descriptor is never "
                  "truncated)");
  }
  if (request.file_offset > UINT64_MAX - request.length ||
      request.file_offset + request.length > uint64_t{INT64_MAX}) {
    return Status(StatusCode::kInvalidArgument, "file offset + length overflows");
  }
  FP_RETURN_IF_ERROR(device->ready(request.device));
  handle::StagedTransfer t;
  t.kind = request.kind;
  t.memory = MemorySpan{request.buffer, static_cast<size_t>(request.length), request.memory,
                        request.device};
  t.path = request.path;
  t.fd = request.fd;
  t.file_offset = request.file_offset;
  t.truncate = request.truncate;
  // As for host memory: a sync request is counted by its own call only.
  std::shared_ptr<handle::DeviceRequests::Done> own =
      device->submit(std::move(t), /*collected_by_wait=*/async_op);
  if (async_op) return 0;
  Result<int> drained = wait();
  if (Status st = own->wait(); !st.is_ok()) return st;
  if (!drained.is_ok()) return drained.status();
  return *drained + 1;
}

Result<int> AioHandle::wait() { return impl_->wait(); }

Result<int> AioHandle::Impl::wait() {
  // Device requests first: their chunks are engine requests that the engine's wait() does not
  // count (IoEngine::start), and each is one request to the caller.
  Result<size_t> staged = device->wait();
  Result<size_t> done = engine->wait();
  std::vector<Validation> checks;
  {
    std::lock_guard lock(mu);
    checks.swap(pending_validations);
  }
  if (!done.is_ok()) return done.status();
  if (!staged.is_ok()) return staged.status();
  FP_RETURN_IF_ERROR(run_validations(std::move(checks)));
  return static_cast<int>(*done + *staged);
}

Status AioHandle::Impl::run_validations(std::vector<Validation> checks) {
  for (const Validation& v : checks) {
    // The request may belong to another thread's batch: compare only once it finished.
    Result<uint64_t> done = v.ticket.wait();
    if (!done.is_ok()) return done.status();
    FP_RETURN_IF_ERROR(compare_with_file(v.buffer, v.bytes, v.path, v.fd, v.offset));
  }
  return Status::ok();
}

namespace {
IoRequest make_request(IoKind kind, const void* buffer, size_t bytes, const std::string& path,
                       int fd, uint64_t offset, bool truncate = false) {
  IoRequest r;
  r.kind = kind;
  r.buffer = static_cast<std::byte*>(const_cast<void*>(buffer));
  r.length = bytes;
  r.path = path;
  r.fd = fd;
  r.file_offset = offset;
  r.truncate = truncate;
  return r;
}
}  // namespace

Result<int> AioHandle::pwrite(const void* buffer, size_t bytes, const std::string& path,
                              bool validate, bool async_op, uint64_t file_offset, bool truncate) {
  return impl_->start(make_request(IoKind::kWrite, buffer, bytes, path, -1, file_offset, truncate),
                      validate, async_op);
}
Result<int> AioHandle::pread(void* buffer, size_t bytes, const std::string& path, bool validate,
                             bool async_op, uint64_t file_offset) {
  return impl_->start(make_request(IoKind::kRead, buffer, bytes, path, -1, file_offset), validate,
                      async_op);
}
Result<int> AioHandle::sync_pwrite(const void* buffer, size_t bytes, const std::string& path,
                                   uint64_t file_offset, bool truncate) {
  return pwrite(buffer, bytes, path, false, false, file_offset, truncate);
}
Result<int> AioHandle::sync_pread(void* buffer, size_t bytes, const std::string& path,
                                  uint64_t file_offset) {
  return pread(buffer, bytes, path, false, false, file_offset);
}
Result<int> AioHandle::async_pwrite(const void* buffer, size_t bytes, const std::string& path,
                                    uint64_t file_offset, bool truncate) {
  return pwrite(buffer, bytes, path, false, true, file_offset, truncate);
}
Result<int> AioHandle::async_pread(void* buffer, size_t bytes, const std::string& path,
                                   uint64_t file_offset) {
  return pread(buffer, bytes, path, false, true, file_offset);
}
Result<int> AioHandle::async_pwrite_fd(const void* buffer, size_t bytes, int fd,
                                       uint64_t file_offset) {
  if (fd < 0)
    return Status(StatusCode::kInvalidArgument, "invalid file descriptor " + std::to_string(fd));
  return impl_->start(make_request(IoKind::kWrite, buffer, bytes, "", fd, file_offset), false,
                      true);
}
Result<int> AioHandle::async_pread_fd(void* buffer, size_t bytes, int fd, uint64_t file_offset) {
  if (fd < 0)
    return Status(StatusCode::kInvalidArgument, "invalid file descriptor " + std::to_string(fd));
  return impl_->start(make_request(IoKind::kRead, buffer, bytes, "", fd, file_offset), false, true);
}

namespace {
IoRequest span_request(IoKind kind, const MemorySpan& m, const std::string& path, int fd,
                       uint64_t offset, bool truncate = false) {
  IoRequest r = make_request(kind, m.data, m.bytes, path, fd, offset, truncate);
  r.memory = m.kind;
  r.device = m.device;
  return r;
}
}  // namespace

Result<int> AioHandle::pwrite(const MemorySpan& buffer, const std::string& path, bool validate,
                              bool async_op, uint64_t file_offset, bool truncate) {
  return impl_->start(span_request(IoKind::kWrite, buffer, path, -1, file_offset, truncate),
                      validate, async_op);
}
Result<int> AioHandle::pread(const MemorySpan& buffer, const std::string& path, bool validate,
                             bool async_op, uint64_t file_offset) {
  return impl_->start(span_request(IoKind::kRead, buffer, path, -1, file_offset), validate,
                      async_op);
}
Result<int> AioHandle::async_pwrite_fd(const MemorySpan& buffer, int fd, uint64_t file_offset) {
  if (fd < 0)
    return Status(StatusCode::kInvalidArgument, "invalid file descriptor " + std::to_string(fd));
  return impl_->start(span_request(IoKind::kWrite, buffer, "", fd, file_offset), false, true);
}
Result<int> AioHandle::async_pread_fd(const MemorySpan& buffer, int fd, uint64_t file_offset) {
  if (fd < 0)
    return Status(StatusCode::kInvalidArgument, "invalid file descriptor " + std::to_string(fd));
  return impl_->start(span_request(IoKind::kRead, buffer, "", fd, file_offset), false, true);
}

Result<std::shared_ptr<PinnedBuffer>> AioHandle::new_cpu_locked_buffer(size_t bytes) {
  FP_ASSIGN_OR_RETURN(auto buffer, impl_->pool.acquire(bytes));
  std::lock_guard lock(impl_->mu);
  impl_->locked.push_back(buffer);
  return buffer;
}

bool AioHandle::free_cpu_locked_buffer(const void* data) {
  std::lock_guard lock(impl_->mu);
  auto& locked = impl_->locked;
  auto it =
      std::find_if(locked.begin(), locked.end(), [&](const auto& b) { return b->data() == data; });
  if (it == locked.end()) return false;
  locked.erase(it);
  return true;
}

bool AioHandle::is_pinned(const void* data, size_t bytes) const {
  std::lock_guard lock(impl_->mu);
  return std::any_of(impl_->locked.begin(), impl_->locked.end(),
                     [&](const auto& b) { return b->contains(data, bytes); });
}

}  // namespace fastpersist
