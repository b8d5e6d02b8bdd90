// SPDX-License-Identifier: Apache-2.0
// The pieces of a checkpoint that several writers produce and one commits (a distributed save):
// `_core.ShardWriter` (tensors in, data files + records out, shard_writer.h),
// `_core.write_sidecar_file`, and `_core.CheckpointCommit` (checkpoint_commit.h; made by
// CheckpointManager.begin_commit). Records (ManifestFile / ManifestTensor, manifest_bindings.cc)
// pickle, so they travel between ranks as they are.
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "deferred_writer.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_commit.h"
#include "fastpersist/shard_writer.h"
#include "fastpersist/split_file.h"
#include "tensor_tuple.h"

namespace fastpersist::python {
namespace {

class PyShardWriter {
 public:
  // The data-file settings of `options` (its manager-only fields are ignored), and the rank.
  PyShardWriter(const CheckpointOptions& options, std::optional<uint32_t> rank) {
    ShardWriterOptions o;
    static_cast<DataFileOptions&>(o) = options;
    o.rank = rank;
    o.content_digests = options.content_digests || options.incremental;  // a future base is hashed
    writer_ = unwrap(without_gil([&] { return ShardWriter::create(o); }));
  }

  // Writes the tensors into new files in `directory`.
  ShardWriteResult write(const std::string& directory, const std::vector<TensorTuple>& tensors) {
    std::vector<TensorSource> sources;
    sources.reserve(tensors.size());
    for (const TensorTuple& t : tensors) sources.push_back(tensor_source(t));
    return unwrap(without_gil([&] { return get().write(directory, sources); }));
  }

  // Writes DeferredFileWriters' streams as split files (split_file.h), against the base
  // checkpoint `base_tag` of `root` when given. The writers' lent memory is released
  // afterwards, whatever happened.
  SplitWriteResult write_split(const std::string& directory,
                               const std::vector<PyDeferredFileWriter*>& files,
                               std::optional<std::string> root,
                               std::optional<std::string> base_tag) {
    std::vector<DeferredFileWriter*> raw;
    for (PyDeferredFileWriter* f : files) {
      if (f == nullptr) throw nb::type_error("write_split: None among the files");
      raw.push_back(&f->get());
    }
    std::optional<SplitBase> base;
    if (base_tag && !base_tag->empty()) base = SplitBase{root.value_or(""), *base_tag};
    auto r = without_gil([&] { return write_split_files(directory, raw, get(), base); });
    for (PyDeferredFileWriter* f : files) f->release_lent();
    return unwrap(std::move(r));
  }

  ShardWriter& get() {
    if (!writer_) throw nb::value_error("the ShardWriter is closed");
    return *writer_;
  }
  void close() { writer_.reset(); }

 private:
  std::unique_ptr<ShardWriter> writer_;
};

}  // namespace

void bind_commit(nb::module_& m) {
  using namespace nb::literals;

  nb::class_<ShardWriteResult>(m, "ShardWriteResult",
                               "What ShardWriter.write wrote (shard_writer.h).")
      .def_ro("files", &ShardWriteResult::files, "One record per data file, in file-name order.")
      .def_ro("tensors", &ShardWriteResult::tensors, "One record per tensor, in the order given.")
      .def_ro("bytes_written", &ShardWriteResult::bytes_written);
  nb::class_<SplitWriteResult>(m, "SplitWriteResult",
                               "What one rank's split files became (split_file.h).")
      .def_ro("files", &SplitWriteResult::files)
      .def_ro("tensors", &SplitWriteResult::tensors)
      .def_ro("bytes_written", &SplitWriteResult::bytes_written)
      .def_ro("referenced_bytes", &SplitWriteResult::referenced_bytes)
      .def_ro("references_base", &SplitWriteResult::references_base);

  nb::class_<PyShardWriter>(
      m, "ShardWriter",
      "Writes tensors into new data files of a directory (one rank's share of a "
      "distributed checkpoint); commits nothing.")
      .def(nb::init<const CheckpointOptions&, std::optional<uint32_t>>(), "options"_a,
           "rank"_a.none())
      .def("write", &PyShardWriter::write, "directory"_a, "tensors"_a,
           "Writes (name, dtype, shape, tensor) tuples; returns (files, tensors, bytes_written).")
      .def(
          "write_split", &PyShardWriter::write_split, "directory"_a, "files"_a, "root"_a.none(),
          "base_tag"_a.none(),
          "Writes DeferredFileWriters (finished with write(), not persisted) as split files: their "
          "lent pieces as U8 tensors '<name>#<k>', the rest as skeleton files <name>; against the "
          "base checkpoint root/base_tag when given.")
      .def_prop_ro("staging_bytes", [](PyShardWriter& w) { return w.get().staging_bytes(); })
      .def("close", &PyShardWriter::close, "Frees the writer's staging memory and engine.");

  nb::class_<CommitContent>(m, "CommitContent", "What a coordinator commits (checkpoint_commit.h).")
      .def(
          "__init__",
          [](CommitContent* c, std::vector<ManifestFile> files, std::vector<ManifestTensor> tensors,
             std::optional<int64_t> step, std::string metadata_json,
             std::map<std::string, std::string> versions, uint32_t world_size, bool checksums,
             std::map<std::string, std::string> aliases) {
            new (c) CommitContent();
            c->files = std::move(files);
            c->tensors = std::move(tensors);
            c->step = step;
            c->metadata_json = std::move(metadata_json);
            c->versions = std::move(versions);
            c->world_size = world_size;
            c->checksums = checksums;
            c->aliases = std::move(aliases);
          },
          // The defaults are CommitContent's own.
          nb::kw_only(), "files"_a, "tensors"_a = CommitContent{}.tensors,
          "step"_a.none() = CommitContent{}.step, "metadata_json"_a = CommitContent{}.metadata_json,
          "versions"_a = CommitContent{}.versions, "world_size"_a = CommitContent{}.world_size,
          "checksums"_a = CommitContent{}.checksums, "aliases"_a = CommitContent{}.aliases)
      .def_ro("files", &CommitContent::files)
      .def_ro("tensors", &CommitContent::tensors)
      .def_ro("step", &CommitContent::step)
      .def_ro("metadata_json", &CommitContent::metadata_json)
      .def_ro("world_size", &CommitContent::world_size)
      .def_ro("checksums", &CommitContent::checksums);

  nb::class_<CheckpointCommit>(m, "CheckpointCommit",
                               "A checkpoint that other writers fill and this process commits.")
      .def_prop_ro("tag", &CheckpointCommit::tag)
      .def_prop_ro("directory", &CheckpointCommit::directory)
      .def_prop_ro("base_tag", &CheckpointCommit::base_tag,
                   "Incremental: the checkpoint the writers may reference ('' for a full one).")
      .def_prop_ro("finished", &CheckpointCommit::finished)
      .def_prop_ro("retention_error",
                   [](const CheckpointCommit& c) {
                     const Status& st = c.retention_error();
                     return st.is_ok() ? std::string() : st.to_string();
                   })
      .def(
          "commit",
          [](CheckpointCommit& c, CommitContent content) {
            check(without_gil([&] { return c.commit(std::move(content)); }));
          },
          "content"_a, "Commits the records (checkpoint_commit.h); the commit is over either way.")
      .def("abort", [](CheckpointCommit& c) { check(without_gil([&] { return c.abort(); })); });

  m.def(
      "write_sidecar_file",
      [](const std::string& directory, const std::string& name, nb::bytes data, bool durable,
         bool checksums, std::optional<uint32_t> rank) {
        std::string_view bytes(data.c_str(), data.size());
        return unwrap(without_gil(
            [&] { return write_sidecar_file(directory, name, bytes, durable, checksums, rank); }));
      },
      "directory"_a, "name"_a, "data"_a, "durable"_a, "checksums"_a, "rank"_a.none(),
      "Writes a new small file (created, never replacing; synced when durable) and returns its "
      "ManifestFile record (role 'objects', checksum of the whole file).");
}

}  // namespace fastpersist::python
