// SPDX-License-Identifier: Apache-2.0
// `_core.run_cli(argv)`: the `fastpersist` command line run in this process (tools/run_cli.h),
// so that commands naming an object store use the client the Python package installed; and
// `_core.format_bytes(n)`, the CLI's one way of writing a size in text output (tools/format.h).
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "bindings.h"
#include "format.h"
#include "run_cli.h"

namespace fastpersist::python {

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
}

}  // namespace fastpersist::python
