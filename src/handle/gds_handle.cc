// SPDX-License-Identifier: Apache-2.0
#include "fastpersist/gds_handle.h"

#include <algorithm>

#include "buffer/cuda_runtime.h"
#include "handle/device_staging.h"
#include "handle/gds_driver.h"
#include "handle/gds_requests.h"
#include "io/cufile_library.h"

namespace fastpersist {

Status GdsInfo::status() const {
  if (cuda_available && cufile_available) return Status::ok();
  std::string missing;
  if (!cuda_available) missing = "the CUDA runtime (libcudart: " + cuda_reason + ")";
  if (!cufile_available) {
    if (!missing.empty()) missing += " and ";
    missing += "cuFile (" + cufile_reason + ")";
  }
  return Status(StatusCode::kUnavailable,
                "GPUDirect Storage is not available in this process: it needs " + missing);
}

GdsInfo gds_info() {
  GdsInfo info;
  const buffer::CudaRuntime& rt = buffer::cuda_runtime();
  info.cuda_available = rt.available;
  info.cuda_library = rt.library;
  info.cuda_reason = rt.reason;
  const io::CuFileLibrary& lib = io::cufile_library();
  info.cufile_available = lib.available;
  info.cufile_library = lib.library;
  info.cufile_reason = lib.reason;
  io::GdsDriverInfo driver = io::probe_gds_driver();
  info.nvidia_fs_loaded = driver.nvidia_fs_loaded;
  info.nvidia_fs_version = driver.nvidia_fs_version;
  info.compat_mode = driver.compat_mode;
  info.mode = driver.mode;
  return info;
}

struct GdsHandle::Impl {
  std::unique_ptr<AioHandle> host;
  std::unique_ptr<handle::GdsRequests> device;

  // Every device call checks this first, so without CUDA or cuFile it changes nothing.
  Status device_ready(const MemorySpan& m) const {
    if (m.kind != MemoryKind::kCudaDevice) {
      return Status(StatusCode::kInvalidArgument, "expected CUDA device memory, got host memory");
    }
    if (m.device < 0) {
      return Status(StatusCode::kInvalidArgument,
                    "invalid CUDA device " + std::to_string(m.device));
    }
    FP_RETURN_IF_ERROR(gds_info().status());
    return device->ready(m.device);
  }

  Result<int> start(handle::GdsTransfer t, bool validate, bool async_op) {
    FP_RETURN_IF_ERROR(device_ready(t.memory));
    if (validate) {
      return Status(StatusCode::kInvalidArgument,
                    "validate compares the file with the buffer in host memory; the buffer is in "
                    "the memory of CUDA device " +
                        std::to_string(t.memory.device));
    }
    if (t.file_offset > UINT64_MAX - t.memory.bytes ||
        t.file_offset + t.memory.bytes > uint64_t{INT64_MAX}) {
      return Status(StatusCode::kInvalidArgument, "file offset + length overflows");
    }
    // A sync request is counted by its own call only (see AioHandle::Impl::start).
    FP_ASSIGN_OR_RETURN(auto request, device->submit(std::move(t), /*collected_by_wait=*/async_op));
    if (async_op) return 0;
    Result<int> drained = wait();
    if (Status st = handle::GdsRequests::wait_for(request); !st.is_ok()) return st;
    if (!drained.is_ok()) return drained.status();
    return *drained + 1;
  }

  Result<int> wait() {
    Result<size_t> gds = device->wait();
    Result<int> aio = host->wait();
    if (!aio.is_ok()) return aio.status();
    if (!gds.is_ok()) return gds.status();
    return *aio + static_cast<int>(*gds);
  }
};

Result<std::unique_ptr<GdsHandle>> GdsHandle::create(const EngineOptions& options) {
  FP_ASSIGN_OR_RETURN(auto host, AioHandle::create(options));
  auto impl = std::make_unique<Impl>();
  impl->device = std::make_unique<handle::GdsRequests>(options.intra_op_parallelism,
                                                       handle::staging_chunk_bytes(options));
  impl->host = std::move(host);
  return std::unique_ptr<GdsHandle>(new GdsHandle(std::move(impl)));
}

GdsHandle::GdsHandle(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

GdsHandle::~GdsHandle() {
  (void)impl_->device->wait();
  impl_->device->unpin_all();
}

size_t GdsHandle::get_block_size() const { return impl_->host->get_block_size(); }
unsigned GdsHandle::get_queue_depth() const { return impl_->host->get_queue_depth(); }
bool GdsHandle::get_single_submit() const { return impl_->host->get_single_submit(); }
bool GdsHandle::get_overlap_events() const { return impl_->host->get_overlap_events(); }
unsigned GdsHandle::get_intra_op_parallelism() const {
  return impl_->host->get_intra_op_parallelism();
}
size_t GdsHandle::get_alignment() const { return impl_->host->get_alignment(); }
AioHandle& GdsHandle::host() { return *impl_->host; }

std::string GdsHandle::mode() const {
  GdsInfo info = gds_info();
  if (Status st = info.status(); !st.is_ok()) return "unavailable: " + st.message();
  std::string driver = handle::cufile_driver_mode();
  return driver.empty() ? info.mode : info.mode + "; " + driver;
}

namespace {
handle::GdsTransfer transfer(IoKind kind, const MemorySpan& m, const std::string& path, int fd,
                             uint64_t offset, bool truncate) {
  handle::GdsTransfer t;
  t.kind = kind;
  t.memory = m;
  t.path = path;
  t.fd = fd;
  t.file_offset = offset;
  t.truncate = truncate;
  return t;
}
}  // namespace

Result<int> GdsHandle::pwrite(const MemorySpan& buffer, const std::string& path, bool validate,
                              bool async_op, uint64_t file_offset, bool truncate) {
  if (!buffer.on_device()) {
    return impl_->host->pwrite(buffer, path, validate, async_op, file_offset, truncate);
  }
  return impl_->start(transfer(IoKind::kWrite, buffer, path, -1, file_offset, truncate), validate,
                      async_op);
}

Result<int> GdsHandle::pread(const MemorySpan& buffer, const std::string& path, bool validate,
                             bool async_op, uint64_t file_offset) {
  if (!buffer.on_device()) return impl_->host->pread(buffer, path, validate, async_op, file_offset);
  return impl_->start(transfer(IoKind::kRead, buffer, path, -1, file_offset, false), validate,
                      async_op);
}

Result<int> GdsHandle::async_pwrite_fd(const MemorySpan& buffer, int fd, uint64_t file_offset) {
  if (fd < 0)
    return Status(StatusCode::kInvalidArgument, "invalid file descriptor " + std::to_string(fd));
  if (!buffer.on_device()) return impl_->host->async_pwrite_fd(buffer, fd, file_offset);
  return impl_->start(transfer(IoKind::kWrite, buffer, "", fd, file_offset, false), false, true);
}

Result<int> GdsHandle::async_pread_fd(const MemorySpan& buffer, int fd, uint64_t file_offset) {
  if (fd < 0)
    return Status(StatusCode::kInvalidArgument, "invalid file descriptor " + std::to_string(fd));
  if (!buffer.on_device()) return impl_->host->async_pread_fd(buffer, fd, file_offset);
  return impl_->start(transfer(IoKind::kRead, buffer, "", fd, file_offset, false), false, true);
}

Result<int> GdsHandle::wait() { return impl_->wait(); }

Status GdsHandle::pin_device_buffer(const MemorySpan& buffer) {
  FP_RETURN_IF_ERROR(impl_->device_ready(buffer));
  if (buffer.bytes == 0) return Status(StatusCode::kInvalidArgument, "cannot pin an empty buffer");
  return impl_->device->pin(buffer);
}

Result<bool> GdsHandle::unpin_device_buffer(const MemorySpan& buffer) {
  FP_RETURN_IF_ERROR(impl_->device_ready(buffer));
  return impl_->device->unpin(buffer);
}

bool GdsHandle::is_device_pinned(const MemorySpan& buffer) const {
  return buffer.on_device() && impl_->device->is_pinned(buffer);
}

}  // namespace fastpersist
