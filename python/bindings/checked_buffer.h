// SPDX-License-Identifier: Apache-2.0
// The one way a Python object's memory crosses into C++: `checked_buffer` reads the address and
// the byte length from the object itself (the buffer protocol, or DLPack for torch tensors and
// other array libraries), never from numbers the caller passes, and refuses with a ValueError,
// before any I/O, memory that cannot be used as asked: read-only memory to be written,
// non-contiguous layouts, and device memory where the caller does not accept it.
//
// The result holds the object's export (a memoryview or the DLPack import) for as long as it
// lives, so the memory cannot be freed or, for a bytearray, resized while C++ uses it.
// Call with the GIL held.
#pragma once

#include <nanobind/nanobind.h>

#include <cstddef>

namespace fastpersist::python {

namespace nb = nanobind;

// What C++ does with the memory.
enum class MemoryUse {
  kRead,   // reads it (a write to a file): read-only memory is fine
  kWrite,  // writes into it (a read from a file): it must be writable
};

// Where the memory may be.
enum class MemoryPlace {
  kHost,              // host memory only; device memory is a ValueError
  kHostOrCudaDevice,  // also the memory of a CUDA device (the caller copies it with the runtime)
};

struct CheckedBuffer {
  std::byte* data = nullptr;  // null when nbytes == 0
  size_t nbytes = 0;
  int device = -1;  // -1: host memory; N >= 0: memory of CUDA device N
  // Element count and element size as the object describes itself (nbytes = count * size).
  size_t elements = 0;
  size_t element_size = 1;
  // Keeps the memory alive and, for buffer-protocol objects, exported (a memoryview over the
  // object); for DLPack objects the object itself, which owns its storage.
  nb::object pin;
};

// `what` names the argument in error messages ("buffer", "tensor 'a.b'"). Raises ValueError for
// memory that cannot be used as asked, TypeError for an object that exposes no memory at all.
CheckedBuffer checked_buffer(nb::handle obj, MemoryUse use, MemoryPlace place, const char* what);

}  // namespace fastpersist::python
