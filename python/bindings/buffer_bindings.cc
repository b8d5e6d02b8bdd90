// SPDX-License-Identifier: Apache-2.0
// Pinned buffers out (Python buffers come in through checked_buffer.h).
//
// `PinnedBuffer` hands pinned memory from AioHandle.new_cpu_locked_buffer to Python through the
// buffer protocol, so torch.frombuffer, numpy.frombuffer and memoryview keep it alive.
#include <nanobind/stl/string.h>

#include <cstdio>
#include <string>

#include "bindings.h"
#include "fastpersist/pinned_buffer.h"

namespace fastpersist::python {
namespace {

int locked_buffer_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  LockedBuffer* b = nb::inst_ptr<LockedBuffer>(self);
  if (b->buffer == nullptr) {
    view->obj = nullptr;
    PyErr_SetString(PyExc_BufferError, "fastpersist: empty PinnedBuffer");
    return -1;
  }
  // Takes a reference to `self`, which owns the memory, for as long as the view lives.
  return PyBuffer_FillInfo(view, self, b->data(), static_cast<Py_ssize_t>(b->nbytes),
                           /*readonly=*/0, flags);
}

PyType_Slot locked_buffer_slots[] = {
    {Py_bf_getbuffer, reinterpret_cast<void*>(locked_buffer_getbuffer)},
    {0, nullptr},
};

}  // namespace

void bind_buffers(nb::module_& m) {
  using namespace nb::literals;

  nb::class_<LockedBuffer>(m, "PinnedBuffer", nb::type_slots(locked_buffer_slots),
                           "Pinned (page-aligned, mlock'ed) host memory; supports the buffer "
                           "protocol. Memory is released when this object and its views are gone "
                           "and the handle no longer tracks it.")
      .def_prop_ro("address", &LockedBuffer::address)
      .def_prop_ro("nbytes", [](const LockedBuffer& b) { return b.nbytes; })
      .def_prop_ro("capacity",
                   [](const LockedBuffer& b) { return b.buffer ? b.buffer->capacity() : 0; })
      .def_prop_ro("locked", [](const LockedBuffer& b) { return b.buffer && b.buffer->locked(); })
      .def_prop_ro("cuda_registered",
                   [](const LockedBuffer& b) { return b.buffer && b.buffer->cuda_registered(); })
      .def("__len__", [](const LockedBuffer& b) { return b.nbytes; })
      .def("__repr__", [](const LockedBuffer& b) {
        return "<fastpersist PinnedBuffer " + std::to_string(b.nbytes) + " bytes at 0x" + [&] {
          char hex[32];
          std::snprintf(hex, sizeof hex, "%llx", static_cast<unsigned long long>(b.address()));
          return std::string(hex);
        }() + (b.buffer && b.buffer->locked() ? ", locked>" : ", not locked>");
      });

  nb::class_<PinnedBufferPool>(m, "PinnedBufferPool",
                               "Pinned buffers kept for reuse (pinning memory is slow): what "
                               "DeferredFileWriter.snapshot copies into. Released buffers are kept "
                               "up to max_cached_bytes; the rest are freed.")
      .def(nb::init<size_t>(), "max_cached_bytes"_a)
      .def_prop_ro("cached_bytes", &PinnedBufferPool::cached_bytes);
}

}  // namespace fastpersist::python
