// SPDX-License-Identifier: Apache-2.0
#include "checked_buffer.h"

#include <nanobind/ndarray.h>

#include <cstdint>
#include <string>

namespace fastpersist::python {
namespace {

std::string python_type_name(nb::handle obj) { return Py_TYPE(obj.ptr())->tp_name; }

[[noreturn]] void refuse(const char* what, nb::handle obj, const std::string& why) {
  throw nb::value_error(
      ("fastpersist: the " + std::string(what) + " (" + python_type_name(obj) + ") " + why)
          .c_str());
}

CheckedBuffer from_buffer_protocol(nb::handle obj, MemoryUse use, const char* what) {
  // A memoryview holds the export for as long as it lives: the memory can be neither freed nor
  // (for a bytearray) resized while C++ works on it.
  PyObject* raw = PyMemoryView_FromObject(obj.ptr());
  if (raw == nullptr) {
    nb::python_error error;
    refuse(what, obj, std::string("cannot lend its memory: ") + error.what());
  }
  nb::object view = nb::steal(raw);
  const Py_buffer* b = PyMemoryView_GET_BUFFER(raw);
  if (use == MemoryUse::kWrite && b->readonly) {
    refuse(what, obj,
           "is read-only; reading into it needs writable memory (e.g. a bytearray, a writable "
           "numpy array or a tensor)");
  }
  if (!PyBuffer_IsContiguous(b, 'C')) {
    refuse(what, obj, "is not C-contiguous; pass a contiguous copy (numpy.ascontiguousarray)");
  }
  CheckedBuffer out;
  out.nbytes = static_cast<size_t>(b->len);
  out.data = out.nbytes ? static_cast<std::byte*>(b->buf) : nullptr;
  out.element_size = b->itemsize > 0 ? static_cast<size_t>(b->itemsize) : 1;
  out.elements = out.nbytes / out.element_size;
  out.pin = std::move(view);
  return out;
}

bool c_contiguous(const nb::ndarray<nb::ro>& a) {
  if (a.stride_ptr() == nullptr) return true;  // DLPack: null strides mean compact row-major
  int64_t expected = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) == 0) return true;  // no elements, nothing to lay out
    if (a.shape(i) != 1 && a.stride(i) != expected) return false;
    expected *= static_cast<int64_t>(a.shape(i));
  }
  return true;
}

CheckedBuffer from_dlpack(nb::handle obj, MemoryUse use, MemoryPlace place, const char* what) {
  nb::ndarray<nb::ro> a;
  if (!nb::try_cast(obj, a, /*convert=*/false)) {
    // An exporter that refuses (a meta or sparse torch tensor, ...) says why better than we can.
    if (nb::hasattr(obj, "__dlpack__")) {
      try {
        obj.attr("__dlpack__")();
      } catch (nb::python_error& e) {
        refuse(what, obj,
               std::string("is not a dense array in host or CUDA device memory: ") +
                   nb::str(e.value()).c_str());
      }
    }
    throw nb::type_error(("fastpersist: the " + std::string(what) +
                          " must be a torch tensor, a numpy array or a buffer-protocol object "
                          "(bytes, bytearray, memoryview, mmap, ...), got " +
                          python_type_name(obj))
                             .c_str());
  }
  if (use == MemoryUse::kWrite) {
    nb::ndarray<> writable;
    if (!nb::try_cast(obj, writable, /*convert=*/false)) {
      refuse(what, obj, "is read-only; reading into it needs writable memory");
    }
  }
  CheckedBuffer out;
  switch (a.device_type()) {
    case nb::device::cpu::value:
    case nb::device::cuda_host::value:  // pinned host memory
      break;
    case nb::device::cuda::value:
      if (place != MemoryPlace::kHostOrCudaDevice) {
        refuse(what, obj,
               "is in the memory of CUDA device " + std::to_string(a.device_id()) +
                   ", which is not supported here; pass a CPU tensor (e.g. one from "
                   "AioHandle.new_cpu_locked_tensor, filled with .copy_())");
      }
      out.device = a.device_id();
      break;
    default:
      refuse(what, obj,
             "is in device memory (DLPack device type " + std::to_string(a.device_type()) +
                 "), which is not supported; pass a CPU tensor");
  }
  if (a.dtype().lanes != 1 || a.dtype().bits % 8 != 0) {
    refuse(what, obj, "has elements that are not whole bytes");
  }
  if (!c_contiguous(a)) {
    refuse(what, obj,
           "is not contiguous; pass t.contiguous() (for writes) or a contiguous tensor to read "
           "into");
  }
  out.element_size = a.itemsize();
  out.elements = a.size();
  out.nbytes = a.nbytes();
  out.data = out.nbytes ? static_cast<std::byte*>(const_cast<void*>(a.data())) : nullptr;
  out.pin = nb::borrow(obj);
  return out;
}

}  // namespace

CheckedBuffer checked_buffer(nb::handle obj, MemoryUse use, MemoryPlace place, const char* what) {
  if (PyObject_CheckBuffer(obj.ptr())) return from_buffer_protocol(obj, use, what);
  return from_dlpack(obj, use, place, what);
}

}  // namespace fastpersist::python
