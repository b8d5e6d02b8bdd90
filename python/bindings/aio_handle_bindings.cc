// SPDX-License-Identifier: Apache-2.0
// `_core.AioHandle`: the C++ AioHandle, taking the buffer objects themselves.
//
// Every buffer is the Python object (tensor, array, buffer-protocol object): its address and byte
// length are read here (checked_buffer.h), never taken from the caller, and memory that cannot
// be used as asked is a ValueError before any I/O. An async call returns the object that pins
// the buffer (its export); the Python facade keeps it until wait() collected the request
// (python/fastpersist/_keepalive.py). Every transfer, wait and pinned allocation runs with the
// GIL released.
//
// The wrapper shares the C++ handle with every call in progress, so close() from one thread
// while another thread is inside a call never frees the handle under it: the last call to
// finish destroys it (which waits for its requests), always with the GIL released.
#include <nanobind/stl/string.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/unique_ptr.h>

#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "bindings.h"
#include "checked_buffer.h"
#include "fastpersist/aio_handle.h"

namespace fastpersist::python {
namespace {

bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

class PyAioHandle {
 public:
  explicit PyAioHandle(std::unique_ptr<AioHandle> handle) : handle_(std::move(handle)) {}
  ~PyAioHandle() { close(); }

  // Drops this wrapper's reference. If it was the last, destroying the handle waits for its
  // requests: let other threads run meanwhile, unless the interpreter is shutting down (then
  // the GIL must stay where it is).
  void close() {
    std::shared_ptr<AioHandle> last = take();
    if (last == nullptr) return;
    if (Py_IsInitialized() && !interpreter_finalizing() && PyGILState_Check()) {
      nb::gil_scoped_release nogil;
      last.reset();
    }
  }

  std::shared_ptr<AioHandle> get() const {
    std::lock_guard lock(mu_);
    if (handle_ == nullptr) throw nb::value_error("fastpersist: operation on a closed AioHandle");
    return handle_;
  }
  std::shared_ptr<AioHandle> take() {
    std::lock_guard lock(mu_);
    return std::move(handle_);
  }
  bool closed() const {
    std::lock_guard lock(mu_);
    return handle_ == nullptr;
  }

  // Runs `fn(AioHandle&)` without the GIL and returns its (non-Python) result.
  template <typename F>
  auto call(F&& fn) const {
    std::shared_ptr<AioHandle> h = get();
    nb::gil_scoped_release nogil;
    auto result = fn(*h);
    h.reset();  // if close() ran meanwhile, the handle is destroyed here, without the GIL
    return result;
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<AioHandle> handle_;
};

// The memory of a transfer: a file write reads the buffer, a file read writes into it.
CheckedBuffer transfer_buffer(nb::handle buffer, bool is_write) {
  return checked_buffer(buffer, is_write ? MemoryUse::kRead : MemoryUse::kWrite, MemoryPlace::kHost,
                        "buffer");
}

}  // namespace

void bind_aio_handle(nb::module_& m) {
  using namespace nb::literals;
  using H = PyAioHandle;

  nb::class_<H>(m, "AioHandle",
                "DeepNVMe-style async I/O handle (private; see fastpersist.AioHandle)")
      .def_static(
          "create",
          [](const EngineOptions& options) {
            EngineOptions copy = options;
            Result<std::unique_ptr<AioHandle>> r =
                without_gil([&] { return AioHandle::create(copy); });
            return std::make_unique<H>(unwrap(std::move(r)));
          },
          "options"_a)
      .def("close", &H::close,
           "Frees the handle after its requests finished (their errors are wait()'s to report).")
      .def_prop_ro("closed", &H::closed)
      .def("get_block_size", [](const H& s) { return s.get()->get_block_size(); })
      .def("get_queue_depth", [](const H& s) { return s.get()->get_queue_depth(); })
      .def("get_single_submit", [](const H& s) { return s.get()->get_single_submit(); })
      .def("get_overlap_events", [](const H& s) { return s.get()->get_overlap_events(); })
      .def("get_intra_op_parallelism",
           [](const H& s) { return s.get()->get_intra_op_parallelism(); })
      .def("get_alignment", [](const H& s) { return s.get()->get_alignment(); })
      .def_prop_ro("backend", [](const H& s) { return s.get()->engine().backend_name(); })
      .def_prop_ro("backend_reason", [](const H& s) { return s.get()->engine().backend_reason(); })
      .def("options", [](const H& s) { return s.get()->engine().options(); })
      .def("stats", [](const H& s) { return s.get()->engine().stats(); })
      .def("pending", [](const H& s) { return s.get()->engine().pending(); })

      .def(
          "pwrite",
          [](const H& s, nb::handle buffer, const std::string& path, bool validate, bool async_op,
             uint64_t file_offset, bool truncate) {
            CheckedBuffer b = transfer_buffer(buffer, true);
            int n = unwrap(s.call([&](AioHandle& h) {
              return h.pwrite(b.data, b.nbytes, path, validate, async_op, file_offset, truncate);
            }));
            return std::make_pair(n, async_op ? std::move(b.pin) : nb::none());
          },
          "buffer"_a, "path"_a, "validate"_a, "async_op"_a, "file_offset"_a = 0,
          "truncate"_a = false,
          "(completed count, pin): pin is the object to keep until wait() when async_op.")
      .def(
          "pread",
          [](const H& s, nb::handle buffer, const std::string& path, bool validate, bool async_op,
             uint64_t file_offset) {
            CheckedBuffer b = transfer_buffer(buffer, false);
            int n = unwrap(s.call([&](AioHandle& h) {
              return h.pread(b.data, b.nbytes, path, validate, async_op, file_offset);
            }));
            return std::make_pair(n, async_op ? std::move(b.pin) : nb::none());
          },
          "buffer"_a, "path"_a, "validate"_a, "async_op"_a, "file_offset"_a = 0)
      .def(
          "sync_pwrite",
          [](const H& s, nb::handle buffer, const std::string& path, uint64_t file_offset,
             bool truncate) {
            CheckedBuffer b = transfer_buffer(buffer, true);
            return unwrap(s.call([&](AioHandle& h) {
              return h.sync_pwrite(b.data, b.nbytes, path, file_offset, truncate);
            }));
          },
          "buffer"_a, "path"_a, "file_offset"_a = 0, "truncate"_a = false)
      .def(
          "sync_pread",
          [](const H& s, nb::handle buffer, const std::string& path, uint64_t file_offset) {
            CheckedBuffer b = transfer_buffer(buffer, false);
            return unwrap(s.call(
                [&](AioHandle& h) { return h.sync_pread(b.data, b.nbytes, path, file_offset); }));
          },
          "buffer"_a, "path"_a, "file_offset"_a = 0)
      .def(
          "async_pwrite",
          [](const H& s, nb::handle buffer, const std::string& path, uint64_t file_offset,
             bool truncate) {
            CheckedBuffer b = transfer_buffer(buffer, true);
            unwrap(s.call([&](AioHandle& h) {
              return h.async_pwrite(b.data, b.nbytes, path, file_offset, truncate);
            }));
            return std::move(b.pin);
          },
          "buffer"_a, "path"_a, "file_offset"_a = 0, "truncate"_a = false,
          "Returns the object that pins the buffer: keep it until wait() returned.")
      .def(
          "async_pread",
          [](const H& s, nb::handle buffer, const std::string& path, uint64_t file_offset) {
            CheckedBuffer b = transfer_buffer(buffer, false);
            unwrap(s.call(
                [&](AioHandle& h) { return h.async_pread(b.data, b.nbytes, path, file_offset); }));
            return std::move(b.pin);
          },
          "buffer"_a, "path"_a, "file_offset"_a = 0,
          "Returns the object that pins the buffer: keep it until wait() returned.")
      .def(
          "async_pwrite_fd",
          [](const H& s, nb::handle buffer, int fd, uint64_t file_offset) {
            CheckedBuffer b = transfer_buffer(buffer, true);
            unwrap(s.call(
                [&](AioHandle& h) { return h.async_pwrite_fd(b.data, b.nbytes, fd, file_offset); }));
            return std::move(b.pin);
          },
          "buffer"_a, "fd"_a, "file_offset"_a = 0,
          "Returns the object that pins the buffer: keep it until wait() returned.")
      .def(
          "async_pread_fd",
          [](const H& s, nb::handle buffer, int fd, uint64_t file_offset) {
            CheckedBuffer b = transfer_buffer(buffer, false);
            unwrap(s.call(
                [&](AioHandle& h) { return h.async_pread_fd(b.data, b.nbytes, fd, file_offset); }));
            return std::move(b.pin);
          },
          "buffer"_a, "fd"_a, "file_offset"_a = 0,
          "Returns the object that pins the buffer: keep it until wait() returned.")
      .def("wait", [](const H& s) { return unwrap(s.call([](AioHandle& h) { return h.wait(); })); })

      .def(
          "new_cpu_locked_buffer",
          [](const H& s, size_t nbytes) {
            auto buffer =
                unwrap(s.call([&](AioHandle& h) { return h.new_cpu_locked_buffer(nbytes); }));
            return LockedBuffer{std::move(buffer), nbytes};
          },
          "nbytes"_a)
      .def(
          "free_cpu_locked_buffer",
          [](const H& s, nb::handle buffer) {
            CheckedBuffer b = checked_buffer(buffer, MemoryUse::kRead, MemoryPlace::kHost, "buffer");
            return s.get()->free_cpu_locked_buffer(b.data);
          },
          "buffer"_a)
      .def(
          "is_pinned",
          [](const H& s, nb::handle buffer) {
            CheckedBuffer b = checked_buffer(buffer, MemoryUse::kRead, MemoryPlace::kHost, "buffer");
            return b.nbytes > 0 && s.get()->is_pinned(b.data, b.nbytes);
          },
          "buffer"_a);
}

}  // namespace fastpersist::python
