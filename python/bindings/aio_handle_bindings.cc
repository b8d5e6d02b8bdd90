// SPDX-License-Identifier: Apache-2.0
// `_core.AioHandle`: the C++ AioHandle, taking the buffer objects themselves (host memory, or
// CUDA device memory, which the handle stages through pinned host memory). What it shares with
// `_core.GdsHandle` is in handle_bindings.h.
#include <nanobind/stl/unique_ptr.h>

#include <memory>

#include "bindings.h"
#include "fastpersist/aio_handle.h"
#include "handle_bindings.h"

namespace fastpersist::python {

bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

void bind_aio_handle(nb::module_& m) {
  using namespace nb::literals;
  using H = HandleRef<AioHandle>;

  nb::class_<HandleTransfer>(m, "Transfer",
                             "What a handle's pwrite/pread did (AioHandle and GdsHandle).")
      .def_ro("completed", &HandleTransfer::completed,
              "The completed count (DeepNVMe's return value).")
      .def_ro("pin", &HandleTransfer::pin,
              "What keeps the caller's buffer alive until wait() (None when not async).");

  nb::class_<H> cls(m, "AioHandle",
                    "DeepNVMe-style async I/O handle (private; see fastpersist.AioHandle)");
  cls.def_static(
      "create",
      [](const EngineOptions& options) {
        EngineOptions copy = options;
        Result<std::unique_ptr<AioHandle>> r = without_gil([&] { return AioHandle::create(copy); });
        return std::make_unique<H>(unwrap(std::move(r)), "AioHandle");
      },
      "options"_a);
  bind_transfers(cls);
  bind_host_side(cls, [](AioHandle& h) -> AioHandle& { return h; });
}

}  // namespace fastpersist::python
