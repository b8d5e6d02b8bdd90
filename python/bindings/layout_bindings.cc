// SPDX-License-Identifier: Apache-2.0
// `_core.layout`: the on-disk names of fastpersist/layout.h, so that Python never spells them;
// and the layout of a Hugging Face export (fastpersist/hf_export.h), `_core.plan_hf_export`.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>

#include "bindings.h"
#include "fastpersist/hf_export.h"
#include "fastpersist/layout.h"

namespace fastpersist::python {
namespace {

void bind_hf_export(nb::module_& m) {
  using namespace nb::literals;
  nb::class_<HfExportPlan>(m, "HfExportPlan",
                           "The files of a Hugging Face export (fastpersist/hf_export.h).")
      .def_ro("files", &HfExportPlan::files, "The data files, in order.")
      .def_ro("file_of", &HfExportPlan::file_of,
              "For each tensor as given: its file (an index into files).")
      .def_ro("index_json", &HfExportPlan::index_json,
              "model.safetensors.index.json's content; empty with one file.");
  m.def(
      "plan_hf_export",
      [](const std::vector<std::pair<std::string, uint64_t>>& tensors, uint64_t max_shard_bytes) {
        std::vector<HfExportTensor> given;
        given.reserve(tensors.size());
        for (const auto& [name, bytes] : tensors) given.push_back({name, bytes});
        return unwrap(plan_hf_export(given, max_shard_bytes));
      },
      "tensors"_a, "max_shard_bytes"_a,
      "The files of a Hugging Face export of `tensors` ((name, bytes), in order) with at most "
      "max_shard_bytes per file (a larger tensor gets a file of its own).");
  m.attr("HF_INDEX_FILE_NAME") = std::string(kHfIndexFileName);
}

}  // namespace

void bind_layout(nb::module_& m) {
  using namespace nb::literals;
  nb::module_ layout =
      m.def_submodule("layout", "On-disk names of checkpoints (fastpersist/layout.h)");
  auto name = [&](const char* attr, std::string_view value) {
    layout.attr(attr) = std::string(value);
  };
  name("MANIFEST_FILE_NAME", kManifestFileName);
  name("OBJECTS_FILE_NAME", kObjectsFileName);
  name("DATA_FILE_PREFIX", kDataFilePrefix);
  name("DATA_FILE_SUFFIX", kDataFileSuffix);
  name("LATEST_FILE_NAME", kLatestFileName);
  name("LOCK_FILE_NAME", kLockFileName);
  name("TEMP_DIR_PREFIX", kTempDirPrefix);
  name("TRASH_DIR_PREFIX", kTrashDirPrefix);
  name("DCP_METADATA_FILE_NAME", kDcpMetadataFileName);
  layout.def(
      "data_file_name",
      [](size_t index, size_t count, std::optional<uint32_t> rank) {
        return data_file_name(index, count, rank);
      },
      "index"_a, "count"_a, "rank"_a = nb::none(),
      "The data file `index` of `count` (with a rank: tensors-r<rank>-...).");
  layout.def(
      "dcp_objects_file_name", [](uint32_t rank) { return dcp_objects_file_name(rank); }, "rank"_a,
      "The file of a rank's non-tensor items in a distributed checkpoint "
      "(dcp-objects-r<rank>.bin).");
  layout.def(
      "is_data_file_name", [](std::string_view n) { return is_data_file_name(n); }, "name"_a,
      "Whether `name` is a data file name of any rank.");
  bind_hf_export(m);
}

}  // namespace fastpersist::python
