// SPDX-License-Identifier: Apache-2.0
// Where the memory of a transfer lives: host memory, or the memory of one CUDA device.
//
// The kind travels with every buffer from the Python edge (which reads it from the object:
// python/bindings/checked_buffer.h) down to the engine, because device memory must never reach
// code that dereferences it on the CPU: a host memcpy, a bounce copy or a pread/pwrite into it
// would crash or silently read garbage. Each layer either handles a kind or refuses it with
// kInvalidArgument (IoEngine moves host memory only; AioHandle stages device memory through
// pinned host memory; GdsHandle hands it to cuFile).
// Plain values; no synchronization.
#pragma once

#include <cstddef>

namespace fastpersist {

// Values are part of the Python bindings' contract: never renumber.
enum class MemoryKind : int {
  kHost = 0,        // pageable or pinned host memory
  kCudaDevice = 1,  // memory of the CUDA device `device`
};

// "host" or "cuda".
const char* memory_kind_name(MemoryKind kind);

// A buffer of `bytes` bytes at `data`, of `kind` (on `device` for kCudaDevice, else -1). The
// caller guarantees that the range is its memory for as long as a transfer uses it.
struct MemorySpan {
  std::byte* data = nullptr;
  size_t bytes = 0;
  MemoryKind kind = MemoryKind::kHost;
  int device = -1;

  static MemorySpan host(const void* data, size_t bytes) {
    return {static_cast<std::byte*>(const_cast<void*>(data)), bytes, MemoryKind::kHost, -1};
  }
  static MemorySpan cuda(const void* data, size_t bytes, int device) {
    return {static_cast<std::byte*>(const_cast<void*>(data)), bytes, MemoryKind::kCudaDevice,
            device};
  }
  bool on_device() const { return kind != MemoryKind::kHost; }
};

}  // namespace fastpersist
