// SPDX-License-Identifier: Apache-2.0
// `_core.DeferredFileWriter` (deferred_file_writer.h): the file object the DeepSpeed checkpoint
// engine serializes into on the training thread and persists later, and `_core.check_object_file`,
// the check of a file against its manifest record that runs beside each load. Lent memory arrives
// as objects read by checked_buffer.h; the writer keeps each one's export until persist() or
// abort() is over, so the memory cannot be freed meanwhile.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings.h"
#include "checked_buffer.h"
#include "deferred_writer.h"
#include "fastpersist/deferred_file_writer.h"
#include "fastpersist/folder_seal.h"
#include "fastpersist/io_engine.h"

namespace fastpersist::python {

void bind_deferred(nb::module_& m) {
  using namespace nb::literals;

  nb::class_<PyDeferredFileWriter>(
      m, "DeferredFileWriter",
      "A file object that records a serialization now (borrowing lent tensor "
      "memory, copying the rest) and persist() writes later, durably, with the "
      "XXH3-64 of the whole file.")
      .def(nb::init<const std::string&, const std::string&, const EngineOptions&,
                    const FastFileWriterOptions&, bool, std::optional<uint32_t>, bool>(),
           "directory"_a, "name"_a, "engine_options"_a, "writer_options"_a, "checksums"_a,
           "rank"_a.none(), "replace_existing"_a = false)
      .def("borrow", &PyDeferredFileWriter::borrow, "memory"_a,
           "Lends host memory (a buffer or a DLPack tensor) that stays alive and unchanged until "
           "snapshot() or persist() returns: pieces inside it are not copied.")
      .def("write", &PyDeferredFileWriter::write, "data"_a, "Records the next bytes of the stream.")
      .def("snapshot", &PyDeferredFileWriter::snapshot, "pool"_a,
           "Copies the borrowed memory into a pinned buffer from the pool (GIL released); the "
           "lent memory may change afterwards. Once, before persist().")
      .def("persist", &PyDeferredFileWriter::persist,
           "Writes the stream as the new file and returns its ManifestFile record (releases the "
           "GIL).")
      .def("abort", &PyDeferredFileWriter::abort, "Forgets the stream; writes nothing.")
      .def("stats", &PyDeferredFileWriter::stats)
      .def_prop_ro("path", &PyDeferredFileWriter::path);

  m.def(
      "check_object_file",
      [](const std::string& path, const ManifestFile& record, bool checksums) {
        check(without_gil([&] { return check_object_file(path, record, checksums); }));
      },
      "path"_a, "record"_a, "checksums"_a,
      "Checks a checkpoint file's size and checksum against its manifest record, reading through "
      "the page cache (CheckpointCorruptError naming the file when they differ).");

  m.attr("FOLDER_SEAL_NAME") = kFolderSealName;
  m.def(
      "seal_folder",
      [](const std::string& dir, bool durable,
         const std::vector<std::tuple<std::string, uint64_t, uint64_t>>& known) {
        std::vector<SealedFile> records;
        for (const auto& [name, size, checksum] : known) records.push_back({name, size, checksum});
        std::vector<SealedFile> files =
            unwrap(without_gil([&] { return seal_folder(dir, durable, records); }));
        nb::list out;
        for (const SealedFile& f : files) out.append(nb::make_tuple(f.name, f.size, f.checksum));
        return out;
      },
      "dir"_a, "durable"_a, "known"_a = std::vector<std::tuple<std::string, uint64_t, uint64_t>>{},
      "Seals a folder another writer filled (folder_seal.h): fdatasyncs its files, writes the "
      "marker of their sizes and XXH3-64 last; `known` (name, size, checksum) records of files "
      "written and hashed by fastpersist are taken, not read again. Returns [(name, size, "
      "checksum)].");
  m.def(
      "check_sealed_folder",
      [](const std::string& dir, bool checksums) {
        SealCheck c = unwrap(without_gil([&] { return check_sealed_folder(dir, checksums); }));
        const char* state = c.state == SealState::kSealed    ? "sealed"
                            : c.state == SealState::kDamaged ? "damaged"
                                                             : "unsealed";
        return nb::make_tuple(std::string(state), c.problem);
      },
      "dir"_a, "checksums"_a,
      "('sealed' | 'unsealed' | 'damaged', what differs) of a folder sealed by seal_folder.");
}

}  // namespace fastpersist::python
