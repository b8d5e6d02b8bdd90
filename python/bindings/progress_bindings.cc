// SPDX-License-Identifier: Apache-2.0
// `_core.ProgressBar`: the CLI's bar (src/common/progress.h), drawn into a Python text stream
// (sys.stderr by default), so the package's progress output is the CLI's line, character for
// character.
#include <nanobind/stl/string.h>

#include <string>
#include <string_view>

#include "bindings.h"
#include "common/progress.h"

namespace fastpersist::python {
namespace {

// Writes each frame to `out` (a Python object with write() and flush()). A progress bar never
// fails the operation it shows: an error of the stream is reported as unraisable and dropped.
ProgressBar::Sink python_sink(nb::object out) {
  if (out.is_none()) return {};
  return [out = std::move(out)](std::string_view text) {
    nb::gil_scoped_acquire gil;
    try {
      out.attr("write")(nb::str(text.data(), text.size()));
      out.attr("flush")();
    } catch (nb::python_error& e) {
      e.discard_as_unraisable("fastpersist.ProgressBar writing its line");
    }
  };
}

}  // namespace

void bind_progress(nb::module_& m) {
  using namespace nb::literals;

  nb::class_<ProgressBar>(
      m, "ProgressBar",
      "A one-line progress bar, the CLI's: '<label>  1.2 GiB / 3.1 GiB  [=====>   ]  1.5 GiB/s  "
      "ETA 0:02', redrawn in place at most every `min_interval` seconds; finish() ends the line "
      "(or blanks it with clear=True). A disabled bar writes nothing. Thread-safe.")
      .def(
          "__init__",
          [](ProgressBar* self, std::string label, bool enabled, nb::object out,
             double min_interval) {
            if (out.is_none()) out = nb::module_::import_("sys").attr("stderr");
            new (self)
                ProgressBar(std::move(label), enabled, python_sink(std::move(out)), min_interval);
          },
          "label"_a, "enabled"_a, "out"_a = nb::none(), "min_interval"_a = 0.1,
          "Draws into `out` (a text stream; None: sys.stderr as it is now).")
      .def_prop_ro("enabled", &ProgressBar::enabled)
      // The sink takes the GIL itself; releasing it here means no thread ever holds the GIL
      // while it waits for the bar's mutex (held by a thread that waits for the GIL).
      .def(
          "update",
          [](ProgressBar& bar, uint64_t done, uint64_t total) {
            without_gil([&] { bar.update(done, total); });
          },
          "done"_a, "total"_a, "`done` of `total` bytes; redraws when the interval passed.")
      .def(
          "finish", [](ProgressBar& bar, bool clear) { without_gil([&] { bar.finish(clear); }); },
          "clear"_a = false,
          "Draws the final state and ends the line; blanks it with `clear`. Idempotent.")
      .def_static(
          "render",
          [](const std::string& label, uint64_t done, uint64_t total, double seconds,
             int bar_width) { return ProgressBar::render(label, done, total, seconds, bar_width); },
          "label"_a, "done"_a, "total"_a, "seconds"_a, "bar_width"_a = 24,
          "The bar's text (without the leading '\\r') for `done` of `total` bytes after "
          "`seconds`.");

  m.def("format_bytes_short", &format_bytes_short, "bytes"_a,
        "'1.2 GiB': one decimal, binary units, as the progress bar writes sizes.");
  m.def("format_eta", &format_eta, "seconds"_a,
        "'0:07', '12:34', '1:02:03': a remaining time as the progress bar writes it.");
  m.def("stderr_is_tty", &stderr_is_tty,
        "Whether file descriptor 2 is a terminal (where the bar is drawn by default).");
}

}  // namespace fastpersist::python
