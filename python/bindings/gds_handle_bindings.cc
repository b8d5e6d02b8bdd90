// SPDX-License-Identifier: Apache-2.0
// `_core.GdsHandle` (cuFile for CUDA device memory, the engine for host memory) and
// `_core.gds_info()`. What it shares with `_core.AioHandle` is in handle_bindings.h. The four
// GDS calls take the tensor itself, like every transfer: its address, length and device are
// read here; host memory is a ValueError, a missing GPU path fastpersist.GpuUnavailableError.
#include <nanobind/stl/unique_ptr.h>

#include <memory>

#include "bindings.h"
#include "fastpersist/gds_handle.h"
#include "handle_bindings.h"

namespace fastpersist::python {
namespace {

MemorySpan device_buffer(nb::handle buffer) {
  CheckedBuffer b =
      checked_buffer(buffer, MemoryUse::kRead, MemoryPlace::kHostOrCudaDevice, "tensor");
  if (b.device < 0) {
    throw nb::value_error(
        "fastpersist: the tensor is in host memory; GPUDirect Storage pins CUDA device memory "
        "(for host memory use new_cpu_locked_tensor)");
  }
  return MemorySpan::cuda(b.data, b.nbytes, b.device);
}

}  // namespace

void bind_gds_handle(nb::module_& m) {
  using namespace nb::literals;
  using H = HandleRef<GdsHandle>;

  nb::class_<GdsInfo>(m, "GdsInfo", "GPUDirect Storage in this process (see gds_info())")
      .def_ro("cuda_available", &GdsInfo::cuda_available)
      .def_ro("cuda_library", &GdsInfo::cuda_library)
      .def_ro("cuda_reason", &GdsInfo::cuda_reason)
      .def_ro("cufile_available", &GdsInfo::cufile_available)
      .def_ro("cufile_library", &GdsInfo::cufile_library)
      .def_ro("cufile_reason", &GdsInfo::cufile_reason)
      .def_ro("nvidia_fs_loaded", &GdsInfo::nvidia_fs_loaded)
      .def_ro("nvidia_fs_version", &GdsInfo::nvidia_fs_version)
      .def_ro("compat_mode", &GdsInfo::compat_mode)
      .def_ro("mode", &GdsInfo::mode)
      .def("unavailable_reason", [](const GdsInfo& i) {
        Status st = i.status();
        return st.is_ok() ? std::string() : st.message();
      });
  m.def(
      "gds_info", [] { return without_gil([] { return gds_info(); }); },
      "Whether cuFile and CUDA are loaded here, and cuFile's mode (opens no driver).");

  nb::class_<H> cls(m, "GdsHandle",
                    "DeepNVMe-style GPUDirect Storage handle (private; see fastpersist.GdsHandle)");
  cls.def_static(
      "create",
      [](const EngineOptions& options) {
        EngineOptions copy = options;
        Result<std::unique_ptr<GdsHandle>> r = without_gil([&] { return GdsHandle::create(copy); });
        return std::make_unique<H>(unwrap(std::move(r)), "GdsHandle");
      },
      "options"_a);
  bind_transfers(cls);
  bind_host_side(cls, [](GdsHandle& h) -> AioHandle& { return h.host(); });
  cls.def("mode", [](const H& s) { return s.get()->mode(); })
      .def(
          "pin_device_buffer",
          [](const H& s, nb::handle tensor) {
            MemorySpan span = device_buffer(tensor);
            Status st = s.call([&](GdsHandle& h) { return h.pin_device_buffer(span); });
            if (!st.is_ok()) raise_gpu_status(st);
          },
          "tensor"_a)
      .def(
          "unpin_device_buffer",
          [](const H& s, nb::handle tensor) {
            MemorySpan span = device_buffer(tensor);
            return unwrap_gpu(s.call([&](GdsHandle& h) { return h.unpin_device_buffer(span); }));
          },
          "tensor"_a)
      .def(
          "is_device_pinned",
          [](const H& s, nb::handle tensor) {
            MemorySpan span = device_buffer(tensor);
            return s.get()->is_device_pinned(span);
          },
          "tensor"_a)
      .def(
          "check_gpu",
          [](const H&) {
            Status st = without_gil([] { return gds_info().status(); });
            if (!st.is_ok()) raise_gpu_status(st);
          },
          "Raises GpuUnavailableError unless CUDA and cuFile are loaded here.");
}

}  // namespace fastpersist::python
