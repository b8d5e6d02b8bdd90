// SPDX-License-Identifier: Apache-2.0
// `_core.DeferredFileWriter`'s class (bound in deferred_bindings.cc), shared with the split write
// of `_core.ShardWriter` (commit_bindings.cc), which takes several of them.
#pragma once

#include <nanobind/nanobind.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "checked_buffer.h"
#include "fastpersist/deferred_file_writer.h"
#include "fastpersist/io_engine.h"

namespace fastpersist::python {

class PyDeferredFileWriter {
 public:
  PyDeferredFileWriter(const std::string& directory, const std::string& name,
                       const EngineOptions& engine_options,
                       const FastFileWriterOptions& writer_options, bool checksums,
                       std::optional<uint32_t> rank, bool replace_existing) {
    DeferredFileWriterOptions o;
    o.writer = writer_options;
    o.checksums = checksums;
    o.rank = rank;
    o.replace_existing = replace_existing;
    writer_ = unwrap(without_gil([&]() -> Result<std::unique_ptr<DeferredFileWriter>> {
      FP_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> engine, IoEngine::create(engine_options));
      return DeferredFileWriter::create(directory, name, o,
                                        std::shared_ptr<IoEngine>(std::move(engine)));
    }));
  }

  void borrow(nb::handle memory) {
    CheckedBuffer b =
        checked_buffer(memory, MemoryUse::kRead, MemoryPlace::kHost, "borrowed memory");
    if (b.nbytes == 0) return;
    writer_->borrow(b.data, b.nbytes);
    lent_.push_back(std::move(b.pin));
  }

  size_t write(nb::handle data) {
    CheckedBuffer b = checked_buffer(data, MemoryUse::kRead, MemoryPlace::kHost, "data");
    check(writer_->write(b.data, b.nbytes));
    return b.nbytes;
  }

  // Copies the borrowed pieces into a buffer from `pool`; then the lent memory is released.
  void snapshot(PinnedBufferPool& pool) {
    check(without_gil([&] { return writer_->snapshot(pool); }));
    lent_.clear();
  }

  ManifestFile persist() {
    Result<ManifestFile> r = without_gil([&] { return writer_->persist(); });
    lent_.clear();
    return unwrap(std::move(r));
  }

  void abort() {
    without_gil([&] {
      writer_->abort();
      return 0;
    });
    lent_.clear();
  }

  nb::dict stats() const {
    DeferredFileWriterStats s = writer_->stats();
    nb::dict d;
    d["bytes"] = s.bytes;
    d["borrowed_bytes"] = s.borrowed_bytes;
    d["copied_bytes"] = s.copied_bytes;
    d["pieces"] = s.pieces;
    d["snapshot_bytes"] = s.snapshot_bytes;
    return d;
  }

  const std::string& path() const { return writer_->path(); }

  // For write_split_files (commit_bindings.cc): the writer, and the release of the lent memory's
  // exports once the split write is over.
  DeferredFileWriter& get() { return *writer_; }
  void release_lent() { lent_.clear(); }

 private:
  std::unique_ptr<DeferredFileWriter> writer_;
  std::vector<nb::object> lent_;  // the exports of borrowed memory, released after persist/abort
};

}  // namespace fastpersist::python
