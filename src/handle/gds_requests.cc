// SPDX-License-Identifier: Apache-2.0
#include "handle/gds_requests.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <future>

#include "common/unique_fd.h"
#include "handle/gds_driver.h"
#include "io/cufile_library.h"
#include "io/transfer_plan.h"

namespace fastpersist::handle {
namespace {

std::string describe(const GdsTransfer& t) {
  return t.fd >= 0 ? "fd " + std::to_string(t.fd) : t.path;
}

}  // namespace

struct GdsRequests::Request {
  GdsTransfer t;
  UniqueFd own_fd;  // opened by path; closed when the request finished
  int fd = -1;
  // Where cuFile sees the memory: the registered buffer that contains it (cuFile wants the
  // registered base and an offset into it), else the memory itself.
  const std::byte* base = nullptr;
  uint64_t base_offset = 0;

  std::mutex mu;
  std::condition_variable cv;
  bool setup_done = false;
  Status setup;
  io::CuFileHandle cufile = nullptr;
  bool registered = false;
  unsigned slices_left = 0;
  bool finished = false;
  Status error;
};

namespace {

// Registers the request's descriptor with cuFile, once, on the first slice's thread.
Status ensure_registered(GdsRequests::Request& r) {
  std::lock_guard lock(r.mu);
  if (r.setup_done) return r.setup;
  r.setup_done = true;
  const io::CuFileLibrary& lib = io::cufile_library();
  io::CuFileDescr descr;
  descr.type = io::kCuFileHandleTypeOpaqueFd;
  descr.handle.fd = r.fd;
  io::CuFileError e = lib.handle_register(&r.cufile, &descr);
  if (e.err != io::kCuFileSuccess) {
    r.setup =
        Status(StatusCode::kIoError, "cuFileHandleRegister failed: " + io::cufile_error_text(e))
            .with_path(describe(r.t));
  } else {
    r.registered = true;
  }
  return r.setup;
}

Status move_bytes(GdsRequests::Request& r, uint64_t file_offset, uint64_t length,
                  uint64_t memory_offset, uint64_t chunk) {
  const io::CuFileLibrary& lib = io::cufile_library();
  const bool write = r.t.kind == IoKind::kWrite;
  uint64_t done = 0;
  while (done < length) {
    size_t want = static_cast<size_t>(std::min(chunk, length - done));
    auto file_at = static_cast<off_t>(file_offset + done);
    auto buf_at = static_cast<off_t>(r.base_offset + memory_offset + done);
    errno = 0;
    ssize_t n = write ? lib.write(r.cufile, r.base, want, file_at, buf_at)
                      : lib.read(r.cufile, const_cast<std::byte*>(r.base), want, file_at, buf_at);
    int saved = errno;
    if (n < 0) {
      std::string what = std::string(write ? "cuFileWrite" : "cuFileRead") +
                         " failed: " + io::cufile_result_text(n, saved);
      Status st = n == -1 && saved != 0 ? Status::from_errno(saved, what)
                                        : Status(StatusCode::kIoError, what);
      return std::move(st).with_path(describe(r.t)).with_range(file_offset + done, want);
    }
    if (n == 0) {
      Status st = write
                      ? Status(StatusCode::kIoError, "cuFileWrite made no progress (0 bytes)", EIO)
                      : Status(StatusCode::kOutOfRange,
                               "unexpected end of file: the file is shorter than when the "
                               "request started");
      return std::move(st).with_path(describe(r.t)).with_range(file_offset + done, want);
    }
    done += static_cast<uint64_t>(std::min<ssize_t>(n, static_cast<ssize_t>(want)));
  }
  return Status::ok();
}

void run_slice(const std::shared_ptr<GdsRequests::Request>& r, io::Slice slice, uint64_t chunk) {
  Status st = select_device(r->t.memory.device);
  if (st.is_ok()) st = open_cufile_driver();
  if (st.is_ok()) st = ensure_registered(*r);
  if (st.is_ok()) st = move_bytes(*r, slice.file_offset, slice.length, slice.buffer_offset, chunk);
  std::lock_guard lock(r->mu);
  if (!st.is_ok() && r->error.is_ok()) r->error = std::move(st);
  if (--r->slices_left == 0) {
    if (r->registered) io::cufile_library().handle_deregister(r->cufile);
    r->registered = false;
    r->own_fd.reset();
    r->finished = true;
    r->cv.notify_all();
  }
}

}  // namespace

GdsRequests::GdsRequests(unsigned threads, uint64_t chunk_bytes)
    : threads_(std::max(threads, 1u)), chunk_bytes_(chunk_bytes) {}

GdsRequests::~GdsRequests() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : pool_) t.join();
}

void GdsRequests::post(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    while (pool_.size() < threads_) pool_.emplace_back([this] { run(); });
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void GdsRequests::run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

Status GdsRequests::run_on_device(int device, const std::function<Status()>& fn) {
  std::promise<Status> result;
  std::future<Status> done = result.get_future();
  post([&] {
    Status st = select_device(device);
    if (st.is_ok()) st = open_cufile_driver();
    if (st.is_ok()) st = fn();
    result.set_value(std::move(st));
  });
  return done.get();
}

Status GdsRequests::ready(int device) {
  {
    std::lock_guard lock(mu_);
    if (auto it = readiness_.find(device); it != readiness_.end()) return it->second;
  }
  Status st = run_on_device(device, [] { return Status::ok(); });
  if (!st.is_ok()) {
    st = Status(StatusCode::kUnavailable, "GdsHandle cannot move the memory of CUDA device " +
                                              std::to_string(device) + ": " + st.message());
  }
  std::lock_guard lock(mu_);
  readiness_.emplace(device, st);
  return st;
}

Result<std::shared_ptr<GdsRequests::Request>> GdsRequests::submit(GdsTransfer transfer,
                                                                  bool collected_by_wait) {
  auto r = std::make_shared<Request>();
  r->t = std::move(transfer);
  const GdsTransfer& t = r->t;
  const bool write = t.kind == IoKind::kWrite;
  if (t.fd >= 0) {
    r->fd = t.fd;
  } else {
    int flags = (write ? O_WRONLY | O_CREAT | (t.truncate ? O_TRUNC : 0) : O_RDONLY) | O_CLOEXEC;
    // GPUDirect needs O_DIRECT. In compatibility mode cuFile does POSIX I/O on our descriptor,
    // where O_DIRECT would make unaligned offsets and lengths fail, so it gets a buffered one;
    // so does a filesystem that refuses O_DIRECT (tmpfs).
    int fd = -1;
    if (!io::probe_gds_driver().compat_mode) {
      fd = ::open(t.path.c_str(), flags | O_DIRECT, 0644);
      if (fd < 0 && errno != EINVAL) fd = -2;  // a real open error: report it below
    }
    if (fd == -1) fd = ::open(t.path.c_str(), flags, 0644);
    if (fd < 0) {
      return Status::from_errno(
                 errno, std::string("cannot open file for ") + (write ? "writing" : "reading"))
          .with_path(t.path);
    }
    r->own_fd.reset(fd);
    r->fd = fd;
  }
  if (!write) {
    struct stat st {};
    if (::fstat(r->fd, &st) != 0)
      return Status::from_errno(errno, "fstat failed").with_path(describe(t));
    uint64_t end = t.file_offset + t.memory.bytes;
    if (S_ISREG(st.st_mode) && end > static_cast<uint64_t>(st.st_size)) {
      return Status(StatusCode::kOutOfRange, "read past the end of the file (the file has " +
                                                 std::to_string(st.st_size) + " bytes)")
          .with_path(describe(t))
          .with_range(t.file_offset, t.memory.bytes);
    }
  }
  r->base = t.memory.data;
  {
    std::lock_guard lock(pins_mu_);
    auto it = pins_.upper_bound(t.memory.data);
    if (it != pins_.begin()) {
      --it;
      if (t.memory.data + t.memory.bytes <= it->first + it->second.bytes) {
        r->base = it->first;
        r->base_offset = static_cast<uint64_t>(t.memory.data - it->first);
      }
    }
  }
  std::vector<io::Slice> slices =
      io::split_into_slices(t.file_offset, t.memory.bytes, threads_, 4096);
  {
    std::lock_guard lock(mu_);
    if (collected_by_wait) uncollected_.push_back(r);
  }
  if (slices.empty()) {
    std::lock_guard lock(r->mu);
    r->own_fd.reset();
    r->finished = true;
    return r;
  }
  r->slices_left = static_cast<unsigned>(slices.size());
  for (const io::Slice& s : slices) {
    post([r, s, chunk = chunk_bytes_] { run_slice(r, s, chunk); });
  }
  return r;
}

Status GdsRequests::wait_for(const std::shared_ptr<Request>& request) {
  std::unique_lock lock(request->mu);
  request->cv.wait(lock, [&] { return request->finished; });
  return request->error;
}

Result<size_t> GdsRequests::wait() {
  std::vector<std::shared_ptr<Request>> batch;
  {
    std::lock_guard lock(mu_);
    batch.swap(uncollected_);
  }
  Status first;
  for (const auto& r : batch) {
    Status st = wait_for(r);
    if (first.is_ok()) first = st;
  }
  if (!first.is_ok()) return first;
  return batch.size();
}

}  // namespace fastpersist::handle
