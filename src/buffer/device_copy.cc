// SPDX-License-Identifier: Apache-2.0
#include "buffer/device_copy.h"

#include <string>
#include <thread>
#include <vector>

#include "buffer/cuda_runtime.h"
#include "fastpersist/pinned_buffer.h"

namespace fastpersist::buffer {
namespace {

// kUnavailable when the device cannot be used at all, kIoError when a copy failed.
Status cuda_error(StatusCode kind, int code, const std::string& what, int device) {
  const CudaRuntime& rt = cuda_runtime();
  const char* text = rt.get_error_string != nullptr ? rt.get_error_string(code) : nullptr;
  return Status(kind, what + " (CUDA device " + std::to_string(device) +
                          "): " + (text != nullptr ? text : "CUDA error") + " [cudaError " +
                          std::to_string(code) + "]");
}

// This thread's copy streams, one per device, destroyed when the thread ends.
class ThreadStreams {
 public:
  ThreadStreams() = default;
  ThreadStreams(const ThreadStreams&) = delete;
  ThreadStreams& operator=(const ThreadStreams&) = delete;
  ~ThreadStreams() {
    const CudaRuntime& rt = cuda_runtime();
    if (!rt.available) return;
    for (size_t d = 0; d < streams_.size(); ++d) {
      // At process exit the runtime may already be shut down; its error code is harmless here.
      if (streams_[d] != nullptr && rt.set_device(static_cast<int>(d)) == kCudaSuccess) {
        rt.stream_destroy(streams_[d]);
      }
    }
  }

  // Selects `device` on this thread and returns its stream, creating it the first time.
  Status stream_for(int device, CudaStream* out) {
    if (device < 0) {
      return Status(StatusCode::kInvalidArgument, "invalid CUDA device " + std::to_string(device));
    }
    const CudaRuntime& rt = cuda_runtime();
    if (!rt.available) {
      return Status(
          StatusCode::kUnavailable,
          "GPU memory cannot be copied: the CUDA runtime is not available (" + rt.reason + ")");
    }
    if (int rc = rt.set_device(device); rc != kCudaSuccess)
      return cuda_error(StatusCode::kUnavailable, rc, "cudaSetDevice failed", device);
    if (static_cast<size_t>(device) >= streams_.size())
      streams_.resize(static_cast<size_t>(device) + 1, nullptr);
    CudaStream& s = streams_[static_cast<size_t>(device)];
    if (s == nullptr) {
      if (int rc = rt.stream_create_with_flags(&s, kCudaStreamNonBlocking); rc != kCudaSuccess) {
        s = nullptr;
        return cuda_error(StatusCode::kUnavailable, rc,
                          "cannot create a CUDA stream for device-to-host copies", device);
      }
    }
    *out = s;
    return Status::ok();
  }

 private:
  std::vector<CudaStream> streams_;
};

ThreadStreams& thread_streams() {
  thread_local ThreadStreams streams;
  return streams;
}

}  // namespace

Status device_copy_ready(int device) {
  // On a thread of its own: selecting the device on the caller's thread would change the device
  // that torch's ops use there, and putting it back could create a context on device 0. The
  // probe's stream goes with its thread.
  Status st;
  std::thread probe([&] {
    CudaStream stream = nullptr;
    st = thread_streams().stream_for(device, &stream);
  });
  probe.join();
  return st;
}

Status prepare_copy_target(PinnedBuffer& window, int device) {
  CudaStream stream = nullptr;
  FP_RETURN_IF_ERROR(thread_streams().stream_for(device, &stream));
  // Now on `device`, so the registration goes to its context. Unregistered memory still works
  // (the runtime stages the copy), only slower.
  (void)window.register_with_cuda();
  return Status::ok();
}

namespace {

Status start_copy(void* dst, const void* src, size_t bytes, int kind, int device) {
  if (bytes == 0) return Status::ok();
  CudaStream stream = nullptr;
  FP_RETURN_IF_ERROR(thread_streams().stream_for(device, &stream));
  const char* what = kind == kCudaMemcpyDeviceToHost ? "device-to-host" : "host-to-device";
  if (int rc = cuda_runtime().memcpy_async(dst, src, bytes, kind, stream); rc != kCudaSuccess) {
    return cuda_error(
        StatusCode::kIoError, rc,
        std::string(what) + " copy of " + std::to_string(bytes) + " bytes failed to start", device);
  }
  return Status::ok();
}

}  // namespace

Status start_copy_from_device(void* dst, const void* src, size_t bytes, int device) {
  return start_copy(dst, src, bytes, kCudaMemcpyDeviceToHost, device);
}

Status start_copy_to_device(void* dst, const void* src, size_t bytes, int device) {
  return start_copy(dst, src, bytes, kCudaMemcpyHostToDevice, device);
}

Status finish_copies(int device) {
  CudaStream stream = nullptr;
  FP_RETURN_IF_ERROR(thread_streams().stream_for(device, &stream));
  if (int rc = cuda_runtime().stream_synchronize(stream); rc != kCudaSuccess) {
    return cuda_error(StatusCode::kIoError, rc, "a copy between host and device memory failed",
                      device);
  }
  return Status::ok();
}

Status copy_from_device(void* dst, const void* src, size_t bytes, int device) {
  if (bytes == 0) return Status::ok();
  FP_RETURN_IF_ERROR(start_copy_from_device(dst, src, bytes, device));
  return finish_copies(device);
}

}  // namespace fastpersist::buffer

namespace fastpersist {

Status cuda_device_copy_ready(int device) { return buffer::device_copy_ready(device); }

}  // namespace fastpersist
