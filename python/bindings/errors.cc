// SPDX-License-Identifier: Apache-2.0
// The one place where a C++ Status becomes a Python exception.
//
//   status                               Python exception
//   -----------------------------------  --------------------------------------------------
//   carries errno (io error, not found)  OSError(errno, text, filename): Python picks the
//                                        subclass (FileNotFoundError, PermissionError, ...)
//   kNotFound without errno              FileNotFoundError (errno ENOENT)
//   kIoError without errno               OSError(text)
//   kInvalidArgument                     ValueError
//   kOutOfRange                          ValueError (e.g. a read past the end of the file)
//   kAlreadyExists                       FileExistsError (errno EEXIST)
//   kDataLoss                            fastpersist.CheckpointCorruptError (a ValueError)
//   kBusy                                fastpersist.CheckpointLockedError (a RuntimeError)
//   kUnavailable, kInternal              RuntimeError
//   kUnavailable of a GPU transfer       fastpersist.GpuUnavailableError (a RuntimeError): the
//                                        handles' calls raise it through raise_gpu_status
//
// The text always keeps the status's message and, when present, its offset and length.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include "bindings.h"
#include "handle_bindings.h"

namespace fastpersist::python {
namespace {

std::string range_text(const Status& st) {
  if (!st.offset()) return {};
  return "offset " + std::to_string(*st.offset()) + ", length " +
         std::to_string(st.length().value_or(0));
}

// OSError(errno, strerror-like text, filename): str() reads
// "[Errno 2] No such file or directory (open for write failed, offset 0, length 10): '/x/y'".
[[noreturn]] void raise_os_error(const Status& st, int err) {
  std::string text = std::strerror(err);
  std::string detail = st.message();
  std::string range = range_text(st);
  if (!range.empty()) detail += detail.empty() ? range : ", " + range;
  if (!detail.empty()) text += " (" + detail + ")";

  nb::object filename = nb::none();
  if (!st.path().empty()) {
    PyObject* decoded = PyUnicode_DecodeFSDefaultAndSize(st.path().data(),
                                                         static_cast<Py_ssize_t>(st.path().size()));
    if (decoded == nullptr) throw nb::python_error();
    filename = nb::steal(decoded);
  }
  nb::object exc = nb::steal(
      PyObject_CallFunction(PyExc_OSError, "iOO", err, utf8_str(text).ptr(), filename.ptr()));
  if (!exc.is_valid()) throw nb::python_error();
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw nb::python_error();
}

// An exception class defined in fastpersist/errors.py, raised with the status's full text.
[[noreturn]] void raise_package_error(const char* name, const Status& st) {
  nb::object cls = nb::module_::import_("fastpersist.errors").attr(name);
  PyErr_SetObject(cls.ptr(), utf8_str(st.to_string()).ptr());
  throw nb::python_error();
}

}  // namespace

void raise_status(const Status& st) {
  switch (st.code()) {
    case StatusCode::kOk:
      throw std::logic_error("fastpersist: raise_status called with an OK status");
    case StatusCode::kInvalidArgument:
      PyErr_SetObject(PyExc_ValueError, utf8_str(st.to_string()).ptr());
      throw nb::python_error();
    case StatusCode::kOutOfRange:
      PyErr_SetObject(PyExc_ValueError, utf8_str(st.to_string()).ptr());
      throw nb::python_error();
    case StatusCode::kNotFound:
      raise_os_error(st, st.sys_errno() != 0 ? st.sys_errno() : ENOENT);
    case StatusCode::kIoError:
      if (st.sys_errno() != 0) raise_os_error(st, st.sys_errno());
      {
        nb::object exc =
            nb::steal(PyObject_CallFunction(PyExc_OSError, "O", utf8_str(st.to_string()).ptr()));
        if (!exc.is_valid()) throw nb::python_error();
        PyErr_SetObject(PyExc_OSError, exc.ptr());
        throw nb::python_error();
      }
    case StatusCode::kAlreadyExists:
      raise_os_error(st, st.sys_errno() != 0 ? st.sys_errno() : EEXIST);
    case StatusCode::kDataLoss:
      raise_package_error("CheckpointCorruptError", st);
    case StatusCode::kBusy:
      raise_package_error("CheckpointLockedError", st);
    case StatusCode::kUnavailable:
    case StatusCode::kInternal:
      break;
  }
  PyErr_SetObject(PyExc_RuntimeError, utf8_str(st.to_string()).ptr());
  throw nb::python_error();
}

void raise_gpu_status(const Status& st) {
  if (st.code() == StatusCode::kUnavailable) raise_package_error("GpuUnavailableError", st);
  raise_status(st);
}

void bind_errors(nb::module_& m) {
  using namespace nb::literals;
  // Test hook: lets tests/python check the table above without provoking every error for real.
  m.def(
      "_raise_status",
      [](int code, int sys_errno, const std::string& message, const std::string& path,
         std::optional<uint64_t> offset, std::optional<uint64_t> length) {
        if (code <= 0 || code > static_cast<int>(StatusCode::kBusy)) {
          throw nb::value_error("unknown status code");
        }
        Status st(static_cast<StatusCode>(code), message, sys_errno);
        if (!path.empty()) st.with_path(path);
        if (offset) st.with_range(*offset, length.value_or(0));
        raise_status(st);
      },
      "code"_a, "errno"_a = 0, "message"_a = "", "path"_a = "", "offset"_a = nb::none(),
      "length"_a = nb::none());
  nb::dict codes;
  codes["invalid_argument"] = static_cast<int>(StatusCode::kInvalidArgument);
  codes["io_error"] = static_cast<int>(StatusCode::kIoError);
  codes["not_found"] = static_cast<int>(StatusCode::kNotFound);
  codes["unavailable"] = static_cast<int>(StatusCode::kUnavailable);
  codes["out_of_range"] = static_cast<int>(StatusCode::kOutOfRange);
  codes["internal"] = static_cast<int>(StatusCode::kInternal);
  codes["data_loss"] = static_cast<int>(StatusCode::kDataLoss);
  codes["already_exists"] = static_cast<int>(StatusCode::kAlreadyExists);
  codes["busy"] = static_cast<int>(StatusCode::kBusy);
  m.attr("_status_codes") = codes;
}

}  // namespace fastpersist::python
