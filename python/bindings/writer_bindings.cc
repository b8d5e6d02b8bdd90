// SPDX-License-Identifier: Apache-2.0
// `_core.FastFileWriter` (the sink torch.save writes into) and `_core.read_file` (the whole-file
// read behind fastpersist.load). Bytes arrive as objects read by checked_buffer.h (torch hands
// write() a read-only memoryview over its own memory, valid only during the call); the C++
// writer copies or finishes the I/O before returning, so no reference outlives the call.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "bindings.h"
#include "checked_buffer.h"
#include "fastpersist/fast_file_writer.h"
#include "fastpersist/file_reader.h"
#include "fastpersist/io_engine.h"
#include "stream/stale_files.h"

namespace fastpersist::python {
namespace {

class PyFastFileWriter {
 public:
  PyFastFileWriter(const std::string& path, const EngineOptions& engine_options,
                   const FastFileWriterOptions& options) {
    Result<std::unique_ptr<FastFileWriter>> w =
        without_gil([&]() -> Result<std::unique_ptr<FastFileWriter>> {
          FP_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> engine, IoEngine::create(engine_options));
          return FastFileWriter::open(path, options, std::shared_ptr<IoEngine>(std::move(engine)));
        });
    writer_ = unwrap(std::move(w));
  }

  ~PyFastFileWriter() {
    if (writer_ && !writer_->closed()) {
      nb::gil_scoped_release nogil;
      writer_->abort();
    }
  }

  size_t write(nb::handle data) {
    CheckedBuffer b = checked_buffer(data, MemoryUse::kRead, MemoryPlace::kHost, "data");
    check(without_gil([&] { return writer_->write(b.data, b.nbytes); }));
    return b.nbytes;
  }

  void close() {
    check(without_gil([&] { return writer_->close(); }));
  }
  void abort() {
    without_gil([&] {
      writer_->abort();
      return 0;
    });
  }
  FastFileWriter& get() { return *writer_; }

 private:
  std::unique_ptr<FastFileWriter> writer_;
};

nb::dict stats_dict(const FastFileWriterStats& s) {
  nb::dict d;
  d["bytes"] = s.bytes;
  d["persisted_bytes"] = s.persisted_bytes;
  d["write_calls"] = s.write_calls;
  d["write_secs"] = s.write_seconds;
  d["fill_bytes"] = s.fill_bytes;
  d["fill_secs"] = s.fill_seconds;
  d["zero_copy_bytes"] = s.zero_copy_bytes;
  d["slow_path_bytes"] = s.slow_path_bytes;
  d["io_wait_secs"] = s.io_wait_seconds;
  d["drains"] = s.drains;
  d["pinned_bytes"] = s.pinned_bytes;
  return d;
}

using namespace nb::literals;

void bind_fast_file_writer(nb::module_& m) {
  nb::class_<FastFileWriterOptions>(m, "FastFileWriterOptions")
      .def(nb::init<>())
      .def_rw("io_buffer_bytes", &FastFileWriterOptions::io_buffer_bytes)
      .def_rw("single_io_buffer", &FastFileWriterOptions::single_io_buffer)
      .def_rw("zero_copy", &FastFileWriterOptions::zero_copy)
      .def_rw("zero_copy_min_bytes", &FastFileWriterOptions::zero_copy_min_bytes)
      .def_rw("durable", &FastFileWriterOptions::durable)
      .def_rw("num_writers", &FastFileWriterOptions::num_writers)
      .def_rw("writer_rank", &FastFileWriterOptions::writer_rank)
      .def_rw("stripe_bytes", &FastFileWriterOptions::stripe_bytes)
      .def_rw("commit_timeout_seconds", &FastFileWriterOptions::commit_timeout_seconds)
      .def_rw("preallocate_max_bytes", &FastFileWriterOptions::preallocate_max_bytes);

  nb::class_<PyFastFileWriter>(m, "FastFileWriter")
      .def(nb::init<const std::string&, const EngineOptions&, const FastFileWriterOptions&>(),
           "path"_a, "engine_options"_a, "options"_a)
      .def("write", &PyFastFileWriter::write, "data"_a,
           "Appends a C-contiguous buffer; returns its length. Raises OSError on I/O failure.")
      .def("close", &PyFastFileWriter::close,
           "Flushes, fsyncs and renames into place (parallel writers: records this writer's "
           "stripes, and waits up to commit_timeout_seconds for the set to commit).")
      .def("abort", &PyFastFileWriter::abort, "Discards the file; the target is left as it was.")
      .def_prop_ro("bytes_written", [](PyFastFileWriter& w) { return w.get().bytes_written(); })
      .def_prop_ro("closed", [](PyFastFileWriter& w) { return w.get().closed(); })
      .def_prop_ro("committed", [](PyFastFileWriter& w) { return w.get().committed(); })
      .def_prop_ro("file_committed", [](PyFastFileWriter& w) { return w.get().file_committed(); })
      .def_prop_ro("path", [](PyFastFileWriter& w) { return w.get().path(); })
      .def_prop_ro("options", [](PyFastFileWriter& w) { return w.get().options(); })
      .def("stats", [](PyFastFileWriter& w) { return stats_dict(w.get().stats()); })
      .def("stats_line", [](PyFastFileWriter& w) { return w.get().stats().to_string(); });
}

void bind_read_file(nb::module_& m) {
  m.def(
      "read_file",
      [](const std::string& path, const EngineOptions& options, nb::object progress) {
        const std::function<void(uint64_t, uint64_t)> cb = progress_callback(progress);
        auto buffer = unwrap(without_gil([&]() -> Result<std::shared_ptr<PinnedBuffer>> {
          FP_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> engine, IoEngine::create(options));
          return read_whole_file(path, *engine, cb);
        }));
        LockedBuffer out;
        out.nbytes = buffer->size();
        out.buffer = std::move(buffer);
        return out;
      },
      "path"_a, "engine_options"_a, "progress"_a = nb::none(),
      "Reads a whole file with parallel O_DIRECT into one page-aligned buffer (a PinnedBuffer "
      "object, not memory-locked) that supports the buffer protocol. With progress, in 64 MiB "
      "pieces, calling progress(bytes_read, file_size) before the first and after each.");
}

// The sweep of dead writers' temporaries (stale_files.h).
void bind_stale_files(nb::module_& m) {
  nb::class_<StaleFileReport>(m, "StaleFiles",
                              "What clean_stale_temp_files found in one folder (stale_files.h).")
      .def_prop_ro(
          "removed", [](const StaleFileReport& r) { return utf8_list(r.removed); },
          "Temporaries of dead writers that were removed (would be, with dry_run).")
      .def_prop_ro(
          "in_use", [](const StaleFileReport& r) { return utf8_list(r.in_use); },
          "Temporaries that a living writer holds; kept.")
      .def_prop_ro(
          "too_recent", [](const StaleFileReport& r) { return utf8_list(r.too_recent); },
          "Parallel writers' sets that no writer holds but that were written too recently; kept.")
      .def_prop_ro(
          "failed",
          [](const StaleFileReport& r) {
            nb::list out;
            for (const auto& [path, why] : r.failed)
              out.append(nb::make_tuple(utf8_str(path), utf8_str(why)));
            return out;
          },
          "(path, reason) for each temporary-looking entry that could not be removed.")
      .def_ro("removed_bytes", &StaleFileReport::removed_bytes,
              "Disk space the removed temporaries held.")
      .def("__repr__", [](const StaleFileReport& r) {
        return nb::str(
                   "StaleFiles(removed={}, in_use={}, too_recent={}, failed={}, removed_bytes={})")
            .format(r.removed.size(), r.in_use.size(), r.too_recent.size(), r.failed.size(),
                    r.removed_bytes);
      });

  // Read-only: the defaults `remove_stale_temp_files` applies to arguments left at None.
  nb::class_<StaleFileOptions>(m, "StaleFileOptions")
      .def(nb::init<>())
      .def_ro("dry_run", &StaleFileOptions::dry_run)
      .def_ro("parallel_set_min_age_seconds", &StaleFileOptions::parallel_set_min_age_seconds)
      .def_ro("recursive", &StaleFileOptions::recursive);

  m.def(
      "remove_stale_temp_files",
      [](const std::string& dir, std::optional<bool> dry_run,
         std::optional<double> parallel_set_min_age_seconds, std::optional<bool> recursive) {
        StaleFileOptions o;  // the defaults: None keeps them
        o.dry_run = dry_run.value_or(o.dry_run);
        o.parallel_set_min_age_seconds =
            parallel_set_min_age_seconds.value_or(o.parallel_set_min_age_seconds);
        o.recursive = recursive.value_or(o.recursive);
        return unwrap(without_gil([&] { return remove_stale_temp_files(dir, o); }));
      },
      "dir"_a, "dry_run"_a = nb::none(), "parallel_set_min_age_seconds"_a = nb::none(),
      "recursive"_a = nb::none(),
      "Removes the temporaries of FastFileWriters whose process died (see stale_files.h).");
}

}  // namespace

void bind_writer(nb::module_& m) {
  bind_fast_file_writer(m);
  bind_read_file(m);
  bind_stale_files(m);
}

}  // namespace fastpersist::python
