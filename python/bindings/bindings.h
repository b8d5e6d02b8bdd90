// SPDX-License-Identifier: Apache-2.0
// Shared pieces of the private `fastpersist._core` extension: one registration function per
// concept, the single Status -> Python exception mapping, and a GIL-free call helper.
//
// Rules every binding follows: a call that does I/O, waits, allocates pinned memory or may
// otherwise block runs with the GIL released (`without_gil`); a non-OK Status becomes an
// exception only through `raise_status` (errors.cc), with the GIL held again.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fastpersist/checkpoint.h"
#include "fastpersist/pinned_buffer.h"
#include "fastpersist/status.h"
#include "fastpersist/tier.h"

namespace fastpersist::python {

namespace nb = nanobind;

// One entry of a C++ settings table (kEngineSettings, kCheckpointSettings) as Python reads it:
// _core.Setting, by attribute (bind_options registers it; the tables are tuples of them).
struct SettingRecord {
  std::string name;   // the keyword
  std::string field;  // the option struct's field it sets (as bound)
  std::string kind;   // setting_kind_name: "bytes", "count", "flag", ...
};

void bind_errors(nb::module_& m);
void bind_options(nb::module_& m);
void bind_buffers(nb::module_& m);
void bind_aio_handle(nb::module_& m);
void bind_gds_handle(nb::module_& m);
void bind_writer(nb::module_& m);
void bind_checkpoint(nb::module_& m);
void bind_load_outcome(nb::module_& m);
void bind_commit(nb::module_& m);
void bind_deferred(nb::module_& m);
void bind_progress(nb::module_& m);
void bind_paths(nb::module_& m);
void bind_layout(nb::module_& m);
void bind_manifest(nb::module_& m);
void bind_object_stores(nb::module_& m);
// CheckpointInfo, CheckpointLocation, TierStatus, CheckpointListing and list_checkpoints
// (records_bindings.cc); before bind_checkpoint, whose methods return them.
void bind_records(nb::module_& m);
nb::object tier_status(const TierState& t);
// CheckpointManager.locations' answer (bound in records_bindings.cc).
struct CheckpointLocations {
  std::vector<CheckpointPlace> places;
  std::vector<std::string> unreachable;  // tiers that could not be listed: "path: why"
};
// CheckpointManager.prune's answer (bound in records_bindings.cc).
struct PruneOutcome {
  std::vector<std::string> removed;
  std::vector<std::string> damaged;  // failed verification: "tag: why"
};
void bind_cli(nb::module_& m);  // only when the CLI is built (FASTPERSIST_HAVE_CLI)  // after
                                // bind_checkpoint (TierOptions)

// Raises the Python exception for a non-OK status (see errors.cc for the table).
[[noreturn]] void raise_status(const Status& status);

inline void check(const Status& status) {
  if (!status.is_ok()) raise_status(status);
}

template <typename T>
T unwrap(Result<T>&& result) {
  if (!result.is_ok()) raise_status(result.status());
  return std::move(result).value();
}

// `progress(done, total)` for C++ that reports progress on the thread that called it, with the
// GIL released: each call takes the GIL, and an exception the callable raises unwinds the C++
// call (which holds no lock while it reports). Empty for None. `progress` must outlive the call.
inline std::function<void(uint64_t, uint64_t)> progress_callback(const nb::object& progress) {
  if (progress.is_none()) return {};
  return [&progress](uint64_t done, uint64_t total) {
    nb::gil_scoped_acquire gil;
    progress(done, total);
  };
}

// A Python str from bytes that should be UTF-8 but may quote a damaged file: invalid bytes
// become \xNN escapes instead of a UnicodeDecodeError hiding the real error.
inline nb::str utf8_str(const std::string& text) {
  PyObject* s =
      PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "backslashreplace");
  if (s == nullptr) throw nb::python_error();
  return nb::steal<nb::str>(s);
}

inline nb::list utf8_list(const std::vector<std::string>& items) {
  nb::list out;
  for (const std::string& s : items) out.append(utf8_str(s));
  return out;
}

// Runs `fn` with the GIL released and returns its result (which must not be a Python object).
template <typename F>
auto without_gil(F&& fn) {
  nb::gil_scoped_release nogil;
  return fn();
}

// Pinned memory handed to Python (`_core.PinnedBuffer`). Shares ownership with the handle that
// allocated it, so the memory lives while either holds it. Exposes the buffer protocol, so
// torch.frombuffer / numpy.frombuffer / memoryview views keep this object (and the memory) alive.
struct LockedBuffer {
  std::shared_ptr<PinnedBuffer> buffer;
  size_t nbytes = 0;  // as requested; a pooled buffer may be larger

  std::byte* data() const { return buffer ? buffer->data() : nullptr; }
  uintptr_t address() const { return reinterpret_cast<uintptr_t>(data()); }
};

// __eq__ over a record's state, and __hash__ over `key` (a part of it), as a frozen dataclass
// has them.
template <typename Class, typename StateFn, typename KeyFn>
void comparable(Class& cls, StateFn state, KeyFn key) {
  using T = typename Class::Type;
  cls.def("__eq__",
          [state](const T& a, nb::handle b) {
            return nb::isinstance<T>(b) && state(a) == state(nb::cast<const T&>(b));
          })
      .def("__hash__", [key](const T& a) { return nb::hash(nb::cast(key(a))); });
}

}  // namespace fastpersist::python
