// SPDX-License-Identifier: Apache-2.0
// `_core.run_cli(argv)`: the `fastpersist` command line run in this process (tools/run_cli.h),
// so that commands naming an object store use the client the Python package installed; and
// `_core.format_bytes(n)`, the CLI's one way of writing a size in text output (tools/format.h);
// and `_core.parse_convert_args(argv, prog)`, `convert`'s one parser (tools/convert_args.h), which
// `python -m fastpersist.convert` runs.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "bindings.h"
#include "convert_args.h"
#include "format.h"
#include "run_cli.h"

namespace fastpersist::python {
namespace {

void bind_convert_args(nb::module_& m) {
  using namespace nb::literals;
  nb::class_<cli::ConvertArgs>(m, "ConvertArgs",
                               "A parsed `convert` command line (tools/convert_args.h).")
      .def_ro("src", &cli::ConvertArgs::src)
      .def_ro("dst", &cli::ConvertArgs::dst)
      .def_ro("tag", &cli::ConvertArgs::tag)
      .def_ro("prefix", &cli::ConvertArgs::prefix)
      .def_ro("compression", &cli::ConvertArgs::compression)
      .def_ro("compression_level", &cli::ConvertArgs::compression_level)
      .def_ro("drop_non_tensors", &cli::ConvertArgs::drop_non_tensors)
      .def_ro("unsafe_pickle", &cli::ConvertArgs::unsafe_pickle)
      .def_ro("overwrite", &cli::ConvertArgs::overwrite)
      .def_ro("progress", &cli::ConvertArgs::progress)
      .def_ro("no_progress", &cli::ConvertArgs::no_progress)
      .def_ro("materialize", &cli::ConvertArgs::materialize)
      .def("to_argv", &cli::ConvertArgs::to_argv,
           "The command line that parses back to these arguments.");
  nb::class_<cli::ConvertParse>(m, "ConvertParse", "What parse_convert_args found.")
      .def_ro("args", &cli::ConvertParse::args,
              "The conversion to run; None after --help or "
              "on a bad command line.")
      .def_ro("exit_code", &cli::ConvertParse::exit_code)
      .def_ro("out", &cli::ConvertParse::out, "Text for stdout (the help).")
      .def_ro("err", &cli::ConvertParse::err, "Text for stderr (the error).");
  m.def("parse_convert_args", &cli::parse_convert_args, "argv"_a, "prog"_a,
        "Parses `convert`'s command line (without the program's name), naming `prog` in help "
        "and errors: the CLI's own parser.");
}

}  // namespace

void bind_cli(nb::module_& m) {
  using namespace nb::literals;
  m.def(
      "run_cli",
      [](const std::vector<std::string>& args) {
        std::vector<std::string> owned{"fastpersist"};
        owned.insert(owned.end(), args.begin(), args.end());
        std::vector<char*> argv;
        for (std::string& a : owned) argv.push_back(a.data());
        argv.push_back(nullptr);
        nb::gil_scoped_release nogil;
        return cli::run_cli(static_cast<int>(owned.size()), argv.data());
      },
      "args"_a, "Runs `fastpersist ARGS...` in this process and returns its exit status.");
  m.def(
      "format_bytes", [](uint64_t bytes) { return cli::format_bytes(bytes); }, "bytes"_a,
      "A size as the CLI's text output writes it: 4096 -> '4 KiB', 1536 -> '1.50 KiB'.");
  bind_convert_args(m);
}

}  // namespace fastpersist::python
