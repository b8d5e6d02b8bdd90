// SPDX-License-Identifier: Apache-2.0
// The CUDA runtime, found with dlopen at run time. fastpersist never needs CUDA to build; when
// libcudart is present, pinned buffers are also registered with it so device copies are async.
// FASTPERSIST_DISABLE_CUDA=1 skips the lookup.
#pragma once

#include <cstddef>
#include <string>

namespace fastpersist::buffer {

struct CudaRuntime {
  bool available = false;
  std::string library;  // the file that was loaded
  std::string reason;   // why not available
  int (*host_register)(void* ptr, size_t bytes, unsigned flags) = nullptr;
  int (*host_unregister)(void* ptr) = nullptr;
};

// Loaded once per process; thread-safe.
const CudaRuntime& cuda_runtime();

}  // namespace fastpersist::buffer
