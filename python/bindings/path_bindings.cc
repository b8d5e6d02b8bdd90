// SPDX-License-Identifier: Apache-2.0
// `_core.classify_path`: the library's one path classifier (src/checkpoint/path_kind.h), which the
// CLI asks too, so `fastpersist convert` and `fastpersist inspect` agree on what a path is.
#include <nanobind/stl/string.h>

#include <string>

#include "bindings.h"
#include "checkpoint/path_kind.h"

namespace fastpersist::python {

void bind_paths(nb::module_& m) {
  using namespace nb::literals;

  nb::enum_<PathKind>(m, "PathKind", "What a path is (src/checkpoint/path_kind.h).")
      .value("MISSING", PathKind::kMissing)
      .value("CHECKPOINT", PathKind::kCheckpoint)
      .value("INCOMPLETE_CHECKPOINT", PathKind::kIncompleteCheckpoint)
      .value("ROOT", PathKind::kRoot)
      .value("SAFETENSORS", PathKind::kSafetensors)
      .value("TORCH_FILE", PathKind::kTorchFile)
      .value("OTHER_FILE", PathKind::kOtherFile);

  nb::class_<PathInfo>(m, "PathInfo")
      .def_ro("kind", &PathInfo::kind)
      .def_prop_ro(
          "path", [](const PathInfo& p) { return utf8_str(p.path); },
          "As given, except the checkpoint directory for a manifest.json.")
      .def_prop_ro(
          "error", [](const PathInfo& p) { return utf8_str(p.error); },
          "MISSING: why ('... does not exist', 'cannot examine ...').")
      .def_prop_ro(
          "name", [](const PathInfo& p) { return std::string(path_kind_name(p.kind)); },
          "'checkpoint', 'incomplete_checkpoint', 'root', 'safetensors', 'torch', 'other' or "
          "'missing' (the CLI's JSON names).")
      .def_prop_ro(
          "description", [](const PathInfo& p) { return std::string(describe_path_kind(p.kind)); },
          "What it is, for messages: 'a checkpoint directory', 'an incomplete or foreign "
          "checkpoint directory (...)', ...")
      .def("__repr__", [](const PathInfo& p) {
        return "PathInfo(" + std::string(path_kind_name(p.kind)) + ", " + p.path + ")";
      });

  m.def(
      "classify_path",
      [](const std::string& path) { return without_gil([&] { return classify_path(path); }); },
      "path"_a, "What `path` is: a checkpoint directory, a root, a safetensors file, ...");
}

}  // namespace fastpersist::python
