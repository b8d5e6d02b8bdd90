// SPDX-License-Identifier: Apache-2.0
// What `_core.AioHandle` and `_core.GdsHandle` share: the wrapper that owns the C++ handle, and
// the transfer methods, bound once for both (their C++ methods have the same names and
// signatures, as their Python ones do).
//
// Every buffer is the Python object (tensor, array, buffer-protocol object): its address, byte
// length and device are read here (checked_buffer.h), never taken from the caller, and memory
// that cannot be used as asked is a ValueError before any I/O. CUDA device memory is accepted
// and passed on as such (MemorySpan): AioHandle stages it, GdsHandle gives it to cuFile; where
// the GPU path is missing, the call raises fastpersist.GpuUnavailableError (errors.cc). An
// async call returns the object that pins the buffer (its export); the Python facade keeps it
// until wait() collected the request (python/fastpersist/_keepalive.py). Every transfer and wait
// runs with the GIL released.
//
// The wrapper shares the C++ handle with every call in progress, so close() from one thread
// while another thread is inside a call never frees the handle under it: the last call to
// finish destroys it (which waits for its requests), always with the GIL released.
#pragma once

#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "bindings.h"
#include "checked_buffer.h"
#include "fastpersist/aio_handle.h"
#include "fastpersist/memory_kind.h"

namespace fastpersist::python {

bool interpreter_finalizing();

// Raises like raise_status, except that kUnavailable (what a device transfer reports when CUDA
// or cuFile is missing) becomes fastpersist.GpuUnavailableError.
[[noreturn]] void raise_gpu_status(const Status& status);

template <typename T>
T unwrap_gpu(Result<T>&& result) {
  if (!result.is_ok()) raise_gpu_status(result.status());
  return std::move(result).value();
}

template <typename Handle>
class HandleRef {
 public:
  HandleRef(std::unique_ptr<Handle> handle, const char* name)
      : handle_(std::move(handle)), name_(name) {}
  ~HandleRef() { close(); }

  // Drops this wrapper's reference. If it was the last, destroying the handle waits for its
  // requests: let other threads run meanwhile, unless the interpreter is shutting down (then
  // the GIL must stay where it is).
  void close() {
    std::shared_ptr<Handle> last = take();
    if (last == nullptr) return;
    if (Py_IsInitialized() && !interpreter_finalizing() && PyGILState_Check()) {
      nb::gil_scoped_release nogil;
      last.reset();
    }
  }

  std::shared_ptr<Handle> get() const {
    std::lock_guard lock(mu_);
    if (handle_ == nullptr) {
      throw nb::value_error(("fastpersist: operation on a closed " + std::string(name_)).c_str());
    }
    return handle_;
  }
  std::shared_ptr<Handle> take() {
    std::lock_guard lock(mu_);
    return std::move(handle_);
  }
  bool closed() const {
    std::lock_guard lock(mu_);
    return handle_ == nullptr;
  }

  // Runs `fn(Handle&)` without the GIL and returns its (non-Python) result.
  template <typename F>
  auto call(F&& fn) const {
    std::shared_ptr<Handle> h = get();
    nb::gil_scoped_release nogil;
    auto result = fn(*h);
    h.reset();  // if close() ran meanwhile, the handle is destroyed here, without the GIL
    return result;
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<Handle> handle_;
  const char* name_;
};

// The memory of a transfer: a file write reads the buffer, a file read writes into it.
struct TransferBuffer {
  CheckedBuffer checked;
  MemorySpan span;
};

inline TransferBuffer transfer_buffer(nb::handle buffer, bool is_write) {
  TransferBuffer b;
  b.checked = checked_buffer(buffer, is_write ? MemoryUse::kRead : MemoryUse::kWrite,
                             MemoryPlace::kHostOrCudaDevice, "buffer");
  b.span = b.checked.device >= 0
               ? MemorySpan::cuda(b.checked.data, b.checked.nbytes, b.checked.device)
               : MemorySpan::host(b.checked.data, b.checked.nbytes);
  return b;
}

// What pwrite/pread answer (bound as _core.Transfer in aio_handle_bindings.cc): the completed
// count, and the object that keeps the caller's buffer alive until wait() (None when not async).
struct HandleTransfer {
  int completed = 0;
  nb::object pin;
};

// pwrite, pread, sync_*, async_*, async_*_fd and wait, with AioHandle's Python signatures.
template <typename Handle>
void bind_transfers(nb::class_<HandleRef<Handle>>& cls) {
  using namespace nb::literals;
  using H = HandleRef<Handle>;
  cls.def(
         "pwrite",
         [](const H& s, nb::handle buffer, const std::string& path, bool validate, bool async_op,
            uint64_t file_offset, bool truncate) {
           TransferBuffer b = transfer_buffer(buffer, true);
           int n = unwrap_gpu(s.call([&](Handle& h) {
             return h.pwrite(b.span, path, validate, async_op, file_offset, truncate);
           }));
           return HandleTransfer{n, async_op ? std::move(b.checked.pin) : nb::none()};
         },
         "buffer"_a, "path"_a, "validate"_a, "async_op"_a, "file_offset"_a = 0,
         "truncate"_a = false,
         "A Transfer: the completed count, and the pin to keep until wait() when async_op.")
      .def(
          "pread",
          [](const H& s, nb::handle buffer, const std::string& path, bool validate, bool async_op,
             uint64_t file_offset) {
            TransferBuffer b = transfer_buffer(buffer, false);
            int n = unwrap_gpu(s.call(
                [&](Handle& h) { return h.pread(b.span, path, validate, async_op, file_offset); }));
            return HandleTransfer{n, async_op ? std::move(b.checked.pin) : nb::none()};
          },
          "buffer"_a, "path"_a, "validate"_a, "async_op"_a, "file_offset"_a = 0)
      .def(
          "sync_pwrite",
          [](const H& s, nb::handle buffer, const std::string& path, uint64_t file_offset,
             bool truncate) {
            TransferBuffer b = transfer_buffer(buffer, true);
            return unwrap_gpu(s.call([&](Handle& h) {
              return h.pwrite(b.span, path, false, false, file_offset, truncate);
            }));
          },
          "buffer"_a, "path"_a, "file_offset"_a = 0, "truncate"_a = false)
      .def(
          "sync_pread",
          [](const H& s, nb::handle buffer, const std::string& path, uint64_t file_offset) {
            TransferBuffer b = transfer_buffer(buffer, false);
            return unwrap_gpu(s.call(
                [&](Handle& h) { return h.pread(b.span, path, false, false, file_offset); }));
          },
          "buffer"_a, "path"_a, "file_offset"_a = 0)
      .def(
          "async_pwrite",
          [](const H& s, nb::handle buffer, const std::string& path, uint64_t file_offset,
             bool truncate) {
            TransferBuffer b = transfer_buffer(buffer, true);
            unwrap_gpu(s.call([&](Handle& h) {
              return h.pwrite(b.span, path, false, true, file_offset, truncate);
            }));
            return std::move(b.checked.pin);
          },
          "buffer"_a, "path"_a, "file_offset"_a = 0, "truncate"_a = false,
          "Returns the object that pins the buffer: keep it until wait() returned.")
      .def(
          "async_pread",
          [](const H& s, nb::handle buffer, const std::string& path, uint64_t file_offset) {
            TransferBuffer b = transfer_buffer(buffer, false);
            unwrap_gpu(
                s.call([&](Handle& h) { return h.pread(b.span, path, false, true, file_offset); }));
            return std::move(b.checked.pin);
          },
          "buffer"_a, "path"_a, "file_offset"_a = 0,
          "Returns the object that pins the buffer: keep it until wait() returned.")
      .def(
          "async_pwrite_fd",
          [](const H& s, nb::handle buffer, int fd, uint64_t file_offset) {
            TransferBuffer b = transfer_buffer(buffer, true);
            unwrap_gpu(
                s.call([&](Handle& h) { return h.async_pwrite_fd(b.span, fd, file_offset); }));
            return std::move(b.checked.pin);
          },
          "buffer"_a, "fd"_a, "file_offset"_a = 0,
          "Returns the object that pins the buffer: keep it until wait() returned.")
      .def(
          "async_pread_fd",
          [](const H& s, nb::handle buffer, int fd, uint64_t file_offset) {
            TransferBuffer b = transfer_buffer(buffer, false);
            unwrap_gpu(
                s.call([&](Handle& h) { return h.async_pread_fd(b.span, fd, file_offset); }));
            return std::move(b.checked.pin);
          },
          "buffer"_a, "fd"_a, "file_offset"_a = 0,
          "Returns the object that pins the buffer: keep it until wait() returned.")
      .def("wait",
           [](const H& s) { return unwrap_gpu(s.call([](Handle& h) { return h.wait(); })); })
      .def("close", &H::close,
           "Frees the handle after its requests finished (their errors are wait()'s to report).")
      .def_prop_ro("closed", &H::closed)
      .def("get_block_size", [](const H& s) { return s.get()->get_block_size(); })
      .def("get_queue_depth", [](const H& s) { return s.get()->get_queue_depth(); })
      .def("get_single_submit", [](const H& s) { return s.get()->get_single_submit(); })
      .def("get_overlap_events", [](const H& s) { return s.get()->get_overlap_events(); })
      .def("get_intra_op_parallelism",
           [](const H& s) { return s.get()->get_intra_op_parallelism(); })
      .def("get_alignment", [](const H& s) { return s.get()->get_alignment(); });
}

// The host side of a handle (its engine, statistics and locked CPU buffers): `host(h)` is the
// AioHandle that owns them (the handle itself, or GdsHandle's host()).
template <typename Handle, typename HostOf>
void bind_host_side(nb::class_<HandleRef<Handle>>& cls, HostOf host) {
  using namespace nb::literals;
  using H = HandleRef<Handle>;
  cls.def_prop_ro("backend", [host](const H& s) { return host(*s.get()).engine().backend_name(); })
      .def_prop_ro("backend_reason",
                   [host](const H& s) { return host(*s.get()).engine().backend_reason(); })
      .def("options", [host](const H& s) { return host(*s.get()).engine().options(); })
      .def("stats", [host](const H& s) { return host(*s.get()).engine().stats(); })
      .def("pending", [host](const H& s) { return host(*s.get()).engine().pending(); })
      .def(
          "new_cpu_locked_buffer",
          [host](const H& s, size_t nbytes) {
            auto buffer =
                unwrap(s.call([&](Handle& h) { return host(h).new_cpu_locked_buffer(nbytes); }));
            return LockedBuffer{std::move(buffer), nbytes};
          },
          "nbytes"_a)
      .def(
          "free_cpu_locked_buffer",
          [host](const H& s, nb::handle buffer) {
            CheckedBuffer b =
                checked_buffer(buffer, MemoryUse::kRead, MemoryPlace::kHost, "buffer");
            return host(*s.get()).free_cpu_locked_buffer(b.data);
          },
          "buffer"_a)
      .def(
          "is_pinned",
          [host](const H& s, nb::handle buffer) {
            CheckedBuffer b =
                checked_buffer(buffer, MemoryUse::kRead, MemoryPlace::kHost, "buffer");
            return b.nbytes > 0 && host(*s.get()).is_pinned(b.data, b.nbytes);
          },
          "buffer"_a);
}

}  // namespace fastpersist::python
