// SPDX-License-Identifier: Apache-2.0
// The CUDA runtime, found with dlopen at run time. fastpersist never needs CUDA to build; when
// libcudart is present, pinned buffers are also registered with it so device copies are async,
// and checkpoint snapshots copy GPU tensors into pinned staging (buffer/device_copy.h).
// FASTPERSIST_DISABLE_CUDA=1 skips the lookup; FASTPERSIST_CUDA_RUNTIME_LIBRARY names a library
// file to try first.
//
// Only a handful of C entry points are used, declared here with plain C types: cudaError_t and
// cudaMemcpyKind are ints, cudaStream_t is an opaque pointer. Their ABI has not changed since
// CUDA 4.
#pragma once

#include <cstddef>
#include <string>

namespace fastpersist::buffer {

using CudaStream = void*;  // cudaStream_t

inline constexpr int kCudaSuccess = 0;
inline constexpr int kCudaMemcpyHostToDevice = 1;
inline constexpr int kCudaMemcpyDeviceToHost = 2;
inline constexpr unsigned kCudaStreamNonBlocking = 1;

struct CudaRuntime {
  bool available = false;
  std::string library;  // the file that was loaded
  std::string reason;   // why not available
  int (*host_register)(void* ptr, size_t bytes, unsigned flags) = nullptr;
  int (*host_unregister)(void* ptr) = nullptr;
  // Device-to-host copies (checkpoint snapshots of GPU tensors).
  int (*set_device)(int device) = nullptr;
  int (*stream_create_with_flags)(CudaStream* stream, unsigned flags) = nullptr;
  int (*stream_destroy)(CudaStream stream) = nullptr;
  int (*memcpy_async)(void* dst, const void* src, size_t bytes, int kind,
                      CudaStream stream) = nullptr;
  int (*stream_synchronize)(CudaStream stream) = nullptr;
  const char* (*get_error_string)(int error) = nullptr;
  int (*get_last_error)() = nullptr;  // returns and clears the thread's last error
};

// Loaded once per process; thread-safe.
const CudaRuntime& cuda_runtime();

}  // namespace fastpersist::buffer
