// SPDX-License-Identifier: Apache-2.0
// `_core.Manifest`, `_core.ManifestTensor`, `_core.ManifestFile`: a checkpoint's decoded manifest
// as typed, read-only objects (the reader's `manifest` property), and `_core.dtype_table()`, the
// one dtype table both languages use. Python never re-parses manifest JSON.
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "fastpersist/checksum.h"
#include "fastpersist/dtype.h"
#include "fastpersist/manifest.h"

namespace fastpersist::python {

namespace {

// What a record pickles to (records travel between the ranks of a distributed save). The
// XXH3-128 digest travels as its hex form ("" without one): a rank's incremental save records it
// so that the next one can reference this checkpoint. XOR delta bases are written by the
// single-process manager only and never travel.
using TensorState = std::tuple<std::string, std::string, std::vector<uint64_t>, std::string,
                               uint64_t, uint64_t, uint64_t, std::string, uint64_t,
                               std::vector<uint64_t>, std::vector<uint64_t>, std::string>;
using FileState =
    std::tuple<std::string, std::string, uint64_t, uint64_t, uint64_t, std::optional<uint32_t>>;

using namespace nb::literals;

void bind_manifest_tensor(nb::module_& m) {
  nb::class_<ManifestTensor>(m, "ManifestTensor",
                             "One stored tensor of a checkpoint (read-only; pickles).")
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
      .def_prop_ro(
          "digest",
          [](const ManifestTensor& t) -> std::optional<std::string> {
            if (!t.digest) return std::nullopt;
            return digest_to_hex(*t.digest);
          },
          "the XXH3-128 of the raw bytes (hex), recorded for incremental saves; None without one")
      .def(
          "with_block",
          [](const ManifestTensor& t, std::vector<uint64_t> global_shape,
             std::vector<uint64_t> shard_offsets) {
            ManifestTensor out = t;
            out.global_shape = std::move(global_shape);
            out.shard_offsets = std::move(shard_offsets);
            return out;
          },
          "global_shape"_a, "shard_offsets"_a,
          "A copy recorded as the block of a larger tensor that starts at `shard_offsets` "
          "(the commit checks that it fits).")
      .def("__getstate__",
           [](const ManifestTensor& t) {
             if (t.delta_base)
               throw nb::value_error("a record with an XOR delta base does not pickle");
             return TensorState(t.name, t.dtype, t.shape, t.file, t.offset, t.length, t.checksum,
                                t.encoding, t.stored_length, t.global_shape, t.shard_offsets,
                                t.digest ? digest_to_hex(*t.digest) : std::string());
           })
      .def("__setstate__",
           [](ManifestTensor& t, const TensorState& st) {
             new (&t) ManifestTensor();
             std::string digest;
             std::tie(t.name, t.dtype, t.shape, t.file, t.offset, t.length, t.checksum, t.encoding,
                      t.stored_length, t.global_shape, t.shard_offsets, digest) = st;
             if (!digest.empty()) {
               t.digest = digest_from_hex(digest);
               if (!t.digest)
                 throw nb::value_error("a pickled record's digest is not 32 hex digits");
             }
           })
      .def("__repr__", [](const ManifestTensor& t) {
        return nb::str("ManifestTensor({!r}, {}, {})").format(utf8_str(t.name), t.dtype, t.shape);
      });
}

void bind_manifest_file(nb::module_& m) {
  nb::class_<ManifestFile>(m, "ManifestFile", "One file of a checkpoint (read-only; pickles).")
      .def_ro("name", &ManifestFile::name)
      .def_ro("role", &ManifestFile::role)
      .def_ro("size", &ManifestFile::size)
      .def_ro("checksum", &ManifestFile::checksum)
      .def_ro("checksum_bytes", &ManifestFile::checksum_bytes)
      .def_ro("rank", &ManifestFile::rank)
      .def_prop_ro("referenced_checkpoint",
                   [](const ManifestFile& f) { return std::string(referenced_checkpoint(f)); })
      .def("__getstate__",
           [](const ManifestFile& f) {
             return FileState(f.name, f.role, f.size, f.checksum, f.checksum_bytes, f.rank);
           })
      .def("__setstate__",
           [](ManifestFile& f, const FileState& st) {
             new (&f) ManifestFile();
             std::tie(f.name, f.role, f.size, f.checksum, f.checksum_bytes, f.rank) = st;
           })
      .def("__repr__", [](const ManifestFile& f) {
        return nb::str("ManifestFile({!r}, {}, {})").format(f.name, f.role, f.size);
      });
}

void bind_manifest_record(nb::module_& m) {
  nb::class_<Manifest>(m, "Manifest", "A checkpoint's decoded manifest (read-only).")
      .def_ro("format_version", &Manifest::format_version)
      .def_ro("tag", &Manifest::tag)
      .def_ro("step", &Manifest::step)
      .def_ro("sequence", &Manifest::sequence)
      .def_ro("created_unix", &Manifest::created_unix)
      .def_ro("checksum_algorithm", &Manifest::checksum_algorithm)
      .def_ro("versions", &Manifest::versions)
      .def_ro("fingerprint", &Manifest::fingerprint)
      .def_prop_ro("content_hash", &manifest_content_hash,
                   "16 hex digits identifying the tensors' values (manifest_content_hash); "
                   "empty without checksums.")
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
}

void bind_dtype_table(nb::module_& m) {
  nb::class_<DtypeInfo>(m, "DtypeInfo", "One row of the dtype table (dtype.h).")
      .def_prop_ro(
          "name", [](const DtypeInfo& d) { return std::string(d.name); },
          "The safetensors name: 'F32'.")
      .def_prop_ro(
          "torch_name", [](const DtypeInfo& d) { return std::string(d.torch_name); },
          "The torch attribute: 'float32' ('' when torch has none).")
      .def_ro("size", &DtypeInfo::size, "Bytes per element.")
      .def("__repr__", [](const DtypeInfo& d) {
        return nb::str("DtypeInfo({!r}, {!r}, {})")
            .format(std::string(d.name), std::string(d.torch_name), d.size);
      });
  m.def(
      "dtype_table",
      [] { return std::vector<DtypeInfo>(dtype_table().begin(), dtype_table().end()); },
      "Every dtype, in a fixed order.");
}

}  // namespace

void bind_manifest(nb::module_& m) {
  bind_manifest_tensor(m);
  bind_manifest_file(m);
  bind_manifest_record(m);
  bind_dtype_table(m);
}

}  // namespace fastpersist::python
