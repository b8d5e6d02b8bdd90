// SPDX-License-Identifier: Apache-2.0
// GdsHandle: DeepNVMe's `gds_handle` API. CUDA device memory moves between the GPU and files
// with NVIDIA cuFile (GPUDirect Storage); host memory goes through the same engine as
// AioHandle (DeepNVMe's gds_handle also hands CPU tensors to its CPU path).
//
// Same knobs, method names and return values as AioHandle (sync calls return the completed
// count, async calls 0, wait() collects), plus DeepNVMe's four GDS calls, here on byte ranges:
// pin_device_buffer / unpin_device_buffer register device memory with cuFile
// (cuFileBufRegister), so its transfers are DMA straight to and from it; unregistered device
// memory works too, through cuFile's own bounce buffers. (new_/free_pinned_device_tensor are
// the Python façade's: torch allocates, this handle pins.)
//
// cuFile and the CUDA runtime are loaded at run time (src/io/cufile_library.h,
// src/buffer/cuda_runtime.h), never needed to build. Without them the handle still moves host
// memory, and every call that needs the GPU (a transfer of device memory, the pinning calls)
// fails with kUnavailable naming what is missing, before it opens, creates or truncates
// anything. Where the nvidia-fs driver is absent cuFile runs in compatibility mode (POSIX I/O
// through host memory): correct, not faster; mode() says which.
//
// cuFile calls run on the handle's own threads, which select the buffer's device there: the
// caller's current device is never changed, and no CUDA context is created on a device that no
// buffer lives on. cuFile's DMA does not wait for work the caller queued on its streams: the
// caller must have finished writing the memory it hands over (the Python façade synchronizes the
// tensor's current stream) and must leave it alone until the request completed.
// Thread-safety: all methods may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "fastpersist/aio_handle.h"
#include "fastpersist/memory_kind.h"
#include "fastpersist/options.h"
#include "fastpersist/status.h"

namespace fastpersist {

// Whether this process can run GPUDirect Storage transfers, without opening cuFile's driver
// (no CUDA context is created): the libraries found, and the mode cuFile will run in.
struct GdsInfo {
  bool cuda_available = false;
  std::string cuda_library;  // libcudart that was loaded, or ""
  std::string cuda_reason;   // why not
  bool cufile_available = false;
  std::string cufile_library;  // libcufile that was loaded, or ""
  std::string cufile_reason;   // why not
  bool nvidia_fs_loaded = false;
  std::string nvidia_fs_version;
  bool compat_mode = true;
  std::string mode;  // one sentence: GPUDirect Storage, or compatibility mode and why
  // OK when device transfers can be tried, else kUnavailable naming what is missing.
  Status status() const;
};
GdsInfo gds_info();

class GdsHandle {
 public:
  // Succeeds without CUDA or cuFile (host memory still works); see gds_info().
  static Result<std::unique_ptr<GdsHandle>> create(const EngineOptions& options);
  ~GdsHandle();  // waits for requests in flight, unpins what it pinned

  size_t get_block_size() const;
  unsigned get_queue_depth() const;
  bool get_single_submit() const;
  bool get_overlap_events() const;
  unsigned get_intra_op_parallelism() const;
  size_t get_alignment() const;
  // "GPUDirect Storage: ..." or "compatibility mode: ...": what cuFile does here; after the
  // first device transfer also what cuFile's driver reported.
  std::string mode() const;

  // As AioHandle's. Device memory goes to cuFile, `validate` needs host memory.
  Result<int> pwrite(const MemorySpan& buffer, const std::string& path, bool validate,
                     bool async_op, uint64_t file_offset = 0, bool truncate = false);
  Result<int> pread(const MemorySpan& buffer, const std::string& path, bool validate, bool async_op,
                    uint64_t file_offset = 0);
  Result<int> async_pwrite_fd(const MemorySpan& buffer, int fd, uint64_t file_offset = 0);
  Result<int> async_pread_fd(const MemorySpan& buffer, int fd, uint64_t file_offset = 0);
  Result<int> wait();

  // cuFileBufRegister of [buffer, buffer + bytes) (device memory). kInvalidArgument for host
  // memory or a range that overlaps one already pinned by this handle.
  Status pin_device_buffer(const MemorySpan& buffer);
  // cuFileBufDeregister of a range pinned by pin_device_buffer (same start); false if unknown.
  Result<bool> unpin_device_buffer(const MemorySpan& buffer);
  bool is_device_pinned(const MemorySpan& buffer) const;

  // The host side: locked CPU buffers, statistics, the engine.
  AioHandle& host();

 private:
  struct Impl;
  explicit GdsHandle(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fastpersist
