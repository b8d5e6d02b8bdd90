// SPDX-License-Identifier: Apache-2.0
// `_core.Manifest`, `_core.ManifestTensor`, `_core.ManifestFile`: a checkpoint's decoded manifest
// as typed, read-only objects (the reader's `manifest` property), and `_core.dtype_table()`, the
// one dtype table both languages use. Python never re-parses manifest JSON.
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "bindings.h"
#include "fastpersist/dtype.h"
#include "fastpersist/manifest.h"

namespace fastpersist::python {

void bind_manifest(nb::module_& m) {
  using namespace nb::literals;

  nb::class_<ManifestTensor>(m, "ManifestTensor", "One stored tensor of a checkpoint (read-only).")
      .def_ro("name", &ManifestTensor::name)
      .def_ro("dtype", &ManifestTensor::dtype, "safetensors dtype name")
      .def_ro("shape", &ManifestTensor::shape)
      .def_ro("file", &ManifestTensor::file)
      .def_ro("offset", &ManifestTensor::offset, "absolute byte offset in `file`")
      .def_ro("length", &ManifestTensor::length, "raw bytes")
      .def_ro("checksum", &ManifestTensor::checksum)
      .def_ro("encoding", &ManifestTensor::encoding)
      .def_ro("stored_length", &ManifestTensor::stored_length)
      .def_ro("global_shape", &ManifestTensor::global_shape)
      .def_ro("shard_offsets", &ManifestTensor::shard_offsets)
      .def("__repr__", [](const ManifestTensor& t) {
        return nb::str("ManifestTensor({!r}, {}, {})").format(utf8_str(t.name), t.dtype, t.shape);
      });

  nb::class_<ManifestFile>(m, "ManifestFile", "One file of a checkpoint (read-only).")
      .def_ro("name", &ManifestFile::name)
      .def_ro("role", &ManifestFile::role)
      .def_ro("size", &ManifestFile::size)
      .def_ro("checksum", &ManifestFile::checksum)
      .def_ro("checksum_bytes", &ManifestFile::checksum_bytes)
      .def_ro("rank", &ManifestFile::rank)
      .def_prop_ro("referenced_checkpoint",
                   [](const ManifestFile& f) { return std::string(referenced_checkpoint(f)); })
      .def("__repr__", [](const ManifestFile& f) {
        return nb::str("ManifestFile({!r}, {}, {})").format(f.name, f.role, f.size);
      });

  nb::class_<Manifest>(m, "Manifest", "A checkpoint's decoded manifest (read-only).")
      .def_ro("format_version", &Manifest::format_version)
      .def_ro("tag", &Manifest::tag)
      .def_ro("step", &Manifest::step)
      .def_ro("sequence", &Manifest::sequence)
      .def_ro("created_unix", &Manifest::created_unix)
      .def_ro("checksum_algorithm", &Manifest::checksum_algorithm)
      .def_ro("versions", &Manifest::versions)
      .def_ro("fingerprint", &Manifest::fingerprint)
      .def_ro("metadata_json", &Manifest::metadata_json)
      .def_ro("aliases", &Manifest::aliases)
      .def_ro("world_size", &Manifest::world_size)
      .def_ro("files", &Manifest::files)
      .def_ro("tensors", &Manifest::tensors)
      .def_prop_ro("tensor_bytes", &Manifest::tensor_bytes)
      .def(
          "names",
          [](const Manifest& man) {
            std::vector<std::string> out;
            out.reserve(man.tensors.size() + man.aliases.size());
            for (const ManifestTensor& t : man.tensors) out.push_back(t.name);
            for (const auto& [alias, target] : man.aliases) out.push_back(alias);
            return out;
          },
          "Every tensor name: the stored tensors in manifest order, then the aliases.");

  m.def(
      "dtype_table",
      [] {
        nb::list out;
        for (const DtypeInfo& d : dtype_table()) {
          out.append(nb::make_tuple(std::string(d.name), std::string(d.torch_name), d.size));
        }
        return out;
      },
      "(safetensors name, torch name or '', element size) of every dtype, in a fixed order.");
}

}  // namespace fastpersist::python
