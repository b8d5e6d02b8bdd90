// SPDX-License-Identifier: Apache-2.0
// `_core.CheckpointManager`, `_core.PendingSave`, `_core.CheckpointReader` and the free functions
// over checkpoint roots and safetensors headers. Saved tensors cross as the tensor objects, read
// and checked here (checked_buffer.h); the Python façade keeps them alive until the snapshot is
// done. Load destinations cross as (address, capacity, dtype, shape, strides), checked in C++
// before any read (CheckpointReader::load).
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings.h"
#include "checked_buffer.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/safetensors.h"
#include "fastpersist/split_file.h"
#include "fastpersist/tensor_codec.h"
#include "load_outcome.h"
#include "tensor_tuple.h"

namespace fastpersist::python {

// The tensor is the object itself (a torch tensor through DLPack, or any buffer-protocol object):
// its address, byte length and device are read from it here, so the manifest's shape x dtype
// size is checked against the memory that is really there, not against numbers the caller
// computed.
TensorSource tensor_source(const TensorTuple& tuple) {
  const auto& [name, dtype, shape, object] = tuple;
  const std::string what = "tensor '" + name + "'";
  CheckedBuffer b =
      checked_buffer(object, MemoryUse::kRead, MemoryPlace::kHostOrCudaDevice, what.c_str());
  std::optional<size_t> element = safetensors_dtype_size(dtype);
  if (!element)
    throw nb::value_error(("fastpersist: " + what + ": unknown dtype '" + dtype + "'").c_str());
  uint64_t count = 1;
  bool overflow = false;
  for (uint64_t d : shape) {
    if (d != 0 && count > UINT64_MAX / d) overflow = true;
    count *= d;
  }
  if (overflow || count > UINT64_MAX / *element || count * *element != b.nbytes ||
      (b.nbytes > 0 && b.element_size != *element)) {
    throw nb::value_error(
        ("fastpersist: " + what + ": dtype " + dtype + " (" + std::to_string(*element) +
         "-byte elements) and its shape need " +
         (overflow || count > UINT64_MAX / *element ? std::string("more than 2**64")
                                                    : std::to_string(count * *element)) +
         " bytes, but its memory holds " + std::to_string(b.elements) + " elements of " +
         std::to_string(b.element_size) + " bytes (" + std::to_string(b.nbytes) + " bytes)")
            .c_str());
  }
  return {name, dtype, shape, b.data, b.nbytes, b.device};
}
namespace {

// (name, address, capacity_bytes, dtype, shape, strides) of a load destination.
using DestinationTuple = std::tuple<std::string, uintptr_t, uint64_t, std::string,
                                    std::vector<uint64_t>, std::vector<int64_t>>;

class PyCheckpointManager {
 public:
  PyCheckpointManager(const std::string& root, const CheckpointOptions& options) {
    manager_ = unwrap(without_gil([&] { return CheckpointManager::open(root, options); }));
  }
  // A manager dropped without close() closes here, which joins its threads: the drain thread
  // may be waiting for the GIL inside an object store's Python client, so let it run.
  ~PyCheckpointManager() {
    if (!manager_) return;
    if (Py_IsInitialized() && PyGILState_Check()) {
      nb::gil_scoped_release nogil;
      manager_.reset();
    }
  }
  PyCheckpointManager(const PyCheckpointManager&) = delete;
  PyCheckpointManager& operator=(const PyCheckpointManager&) = delete;

  PendingSave save_async(const std::string& tag, const std::vector<TensorTuple>& tensors,
                         const std::map<std::string, std::string>& aliases, nb::bytes objects,
                         std::optional<int64_t> step, const std::string& metadata_json,
                         const std::map<std::string, std::string>& versions) {
    CheckpointContent c;
    c.tensors.reserve(tensors.size());
    for (const TensorTuple& t : tensors) c.tensors.push_back(tensor_source(t));
    c.aliases = aliases;
    c.objects.assign(objects.c_str(), objects.size());
    c.step = step;
    c.metadata_json = metadata_json;
    c.versions = versions;
    return unwrap(without_gil([&] { return get().save_async(tag, std::move(c)); }));
  }

  CheckpointManager& get() {
    if (!manager_) throw nb::value_error("the CheckpointManager is closed");
    return *manager_;
  }
  void close(std::optional<double> drain_timeout) {
    if (!manager_) return;
    Status st = without_gil([&] { return manager_->close(drain_timeout); });
    manager_.reset();
    check(st);
  }
  bool closed() const { return manager_ == nullptr; }

 private:
  std::unique_ptr<CheckpointManager> manager_;
};

class PyCheckpointReader {
 public:
  PyCheckpointReader(const std::string& dir, const EngineOptions& options) {
    reader_ = unwrap(without_gil([&]() -> Result<std::unique_ptr<CheckpointReader>> {
      FP_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> engine, IoEngine::create(options));
      return CheckpointReader::open(dir, std::shared_ptr<IoEngine>(std::move(engine)));
    }));
  }

  // Destinations cross as (name, address, capacity_bytes, dtype, shape, strides): the address
  // of the first element, how many bytes the caller owns from there, and the layout; address 0
  // declares a destination the caller fills itself (see LoadDestination). C++ checks all of it
  // before the first read. Returns a LoadOutcome (load_outcome.h). `progress(done, total)` runs
  // with the GIL; an exception it raises is raised once the load has finished (the reads in
  // flight must complete first). `device_tensors` {destination index: CUDA tensor}: those
  // destinations are the tensors' device memory (address, length and device read from each
  // tensor here, not from the tuple).
  PyLoadOutcome load(std::optional<std::vector<std::string>> names,
                     const std::vector<DestinationTuple>& destinations, bool into,
                     const std::string& dtype,
                     const std::map<std::string, std::string>& dtype_by_name, bool strict,
                     bool verify, uint64_t max_memory, nb::object progress,
                     const std::map<size_t, nb::object>& device_tensors,
                     bool unconvertible_to_caller) {
    LoadRequest req;
    req.names = std::move(names);
    req.destinations.reserve(destinations.size());
    for (const auto& [name, address, capacity, dest_dtype, shape, strides] : destinations) {
      req.destinations.push_back(
          {name, reinterpret_cast<std::byte*>(address), capacity, dest_dtype, shape, strides});
    }
    std::vector<CheckedBuffer> device_memory;  // keeps each tensor exported during the load
    for (const auto& [index, tensor] : device_tensors) {
      if (index >= req.destinations.size())
        throw nb::value_error("device_tensors: index out of range");
      CheckedBuffer b = checked_buffer(tensor, MemoryUse::kWrite, MemoryPlace::kHostOrCudaDevice,
                                       "device destination");
      if (b.device < 0) throw nb::value_error("device_tensors: a tensor in host memory");
      LoadDestination& d = req.destinations[index];
      d.data = b.data;
      d.capacity_bytes = b.nbytes;
      d.strides.clear();  // checked_buffer accepts contiguous memory only
      d.memory = MemoryKind::kCudaDevice;
      d.device = b.device;
      device_memory.push_back(std::move(b));
    }
    req.into = into;
    req.dtype = dtype;
    req.dtype_by_name = dtype_by_name;
    req.strict = strict;
    req.unconvertible_to_caller = unconvertible_to_caller;
    req.verify = verify;
    req.max_memory = max_memory;
    std::optional<nb::python_error> raised;
    if (!progress.is_none()) {
      req.progress = [&](uint64_t done, uint64_t total) {
        nb::gil_scoped_acquire gil;
        if (raised) return;
        try {
          progress(done, total);
        } catch (nb::python_error& e) {
          raised.emplace(std::move(e));
        }
      };
    }
    auto result = without_gil([&] { return reader_->load(req); });
    if (raised) {
      raised->restore();
      throw nb::python_error();
    }
    LoadResult r = unwrap(std::move(result));
    const Manifest& m = reader_->manifest();
    PyLoadOutcome out;
    std::map<const PinnedBuffer*, long> index_of;
    for (const LoadedTensor& t : r.tensors) {
      long buffer = -1;
      if (t.buffer) {
        auto [it, added] = index_of.emplace(t.buffer.get(), static_cast<long>(index_of.size()));
        if (added) {
          LockedBuffer b;
          b.buffer = t.buffer;
          b.nbytes = t.buffer->size();
          out.buffers.append(nb::cast(std::move(b)));
        }
        buffer = it->second;
      }
      out.tensors.append(
          nb::cast(PyLoadedTensor{utf8_str(m.tensors[t.tensor].name), t.dtype, t.shape, buffer,
                                  t.offset, t.nbytes, t.destination}));
    }
    out.destinations = std::move(r.destinations);
    out.missing = utf8_list(r.missing);
    out.unexpected = utf8_list(r.unexpected);
    out.mismatched = utf8_list(r.mismatched);
    return out;
  }

  nb::bytes read_objects() {
    std::string bytes = unwrap(without_gil([&] { return reader_->read_objects(); }));
    return nb::bytes(bytes.data(), bytes.size());
  }

  nb::bytes read_file(const std::string& name) {
    std::string bytes = unwrap(without_gil([&] { return reader_->read_file(name); }));
    return nb::bytes(bytes.data(), bytes.size());
  }

  // A split file written back as the plain file <directory>/<name>, streamed; its record.
  ManifestFile write_plain_split_file(const std::string& name, const std::string& directory,
                                      bool durable, bool checksums, std::optional<uint32_t> rank) {
    return unwrap(without_gil([&]() -> Result<ManifestFile> {
      FP_ASSIGN_OR_RETURN(SplitFileReader split, SplitFileReader::open(*reader_, name));
      return write_plain_file(split, directory, durable, checksums, rank);
    }));
  }

  // A split file opened for reading in ranges (what torch.load reads through a file object).
  SplitFileReader open_split_file(const std::string& name) {
    return unwrap(without_gil([&] { return SplitFileReader::open(*reader_, name); }));
  }

  const Manifest& manifest() const { return reader_->manifest(); }
  const std::string& dir() const { return reader_->dir(); }

 private:
  std::unique_ptr<CheckpointReader> reader_;
};

using namespace nb::literals;

void bind_checkpoint_options(nb::module_& m) {
  nb::class_<CheckpointOptions>(m, "CheckpointOptions")
      .def(nb::init<>())
      .def_rw("engine", &CheckpointOptions::engine)
      .def_rw("staging_budget_bytes", &CheckpointOptions::staging_budget_bytes)
      .def_rw("staging_window_bytes", &CheckpointOptions::staging_window_bytes)
      .def_rw("lock_staging_memory", &CheckpointOptions::lock_staging_memory)
      .def_rw("max_parallel_files", &CheckpointOptions::max_parallel_files)
      .def_rw("target_file_bytes", &CheckpointOptions::target_file_bytes)
      .def_rw("min_file_bytes", &CheckpointOptions::min_file_bytes)
      .def_rw("max_in_flight", &CheckpointOptions::max_in_flight)
      .def_rw("keep_last", &CheckpointOptions::keep_last)
      .def_rw("keep_every", &CheckpointOptions::keep_every)
      .def_rw("durable", &CheckpointOptions::durable)
      .def_rw("checksums", &CheckpointOptions::checksums)
      .def_prop_rw(
          "compression",
          [](const CheckpointOptions& o) { return std::string(compression_name(o.compression)); },
          [](CheckpointOptions& o, const std::string& name) {
            o.compression = unwrap(parse_compression(name));
          })
      .def_rw("compression_level", &CheckpointOptions::compression_level)
      .def_rw("compression_threads", &CheckpointOptions::compression_threads)
      .def_rw("incremental", &CheckpointOptions::incremental)
      .def_rw("full_every", &CheckpointOptions::full_every)
      .def_rw("xor_deltas", &CheckpointOptions::xor_deltas)
      .def_rw("tiers", &CheckpointOptions::tiers)
      .def_rw("pin_until_drained", &CheckpointOptions::pin_until_drained)
      .def_prop_rw(
          "save_every_steps", [](const CheckpointOptions& o) { return o.save_policy.every_steps; },
          [](CheckpointOptions& o, std::optional<int64_t> v) { o.save_policy.every_steps = v; })
      .def_prop_rw(
          "save_every_seconds",
          [](const CheckpointOptions& o) { return o.save_policy.every_seconds; },
          [](CheckpointOptions& o, std::optional<double> v) { o.save_policy.every_seconds = v; })
      .def(
          "validate", [](const CheckpointOptions& o) { check(o.validate()); },
          "ValueError naming the first setting out of range (the tiers are checked at open).");

  // kCheckpointSettings as Setting records: what the Python option builder goes by.
  nb::list settings;
  for (const CheckpointSetting& setting : kCheckpointSettings) {
    settings.append(nb::cast(SettingRecord{std::string(setting.name), std::string(setting.field),
                                           std::string(setting_kind_name(setting.kind))}));
  }
  m.attr("CHECKPOINT_SETTINGS") = nb::tuple(settings);

  nb::class_<TierOptions>(m, "TierOptions")
      .def(nb::init<>())
      .def_rw("path", &TierOptions::path)
      .def_rw("keep_last", &TierOptions::keep_last)
      .def_rw("keep_every", &TierOptions::keep_every)
      .def_rw("every", &TierOptions::every)
      .def_rw("bandwidth_bytes_per_second", &TierOptions::bandwidth_bytes_per_second)
      .def("validate", [](const TierOptions& t) { check(t.validate()); });
}

void bind_checkpoint_manager(nb::module_& m) {
  nb::class_<PendingSave>(m, "PendingSave")
      .def_prop_ro("tag", &PendingSave::tag)
      .def("snapshot_done", &PendingSave::snapshot_done)
      .def("done", &PendingSave::done)
      .def("wait_snapshot",
           [](const PendingSave& p) { check(without_gil([&] { return p.wait_snapshot(); })); })
      .def("wait", [](const PendingSave& p) { check(without_gil([&] { return p.wait(); })); })
      .def(
          "wait_done",
          [](const PendingSave& p) { return without_gil([&] { return p.wait_done(); }); },
          "Blocks until done; True when committed. Leaves a failure for wait() to report.")
      .def_prop_ro("snapshot_seconds", &PendingSave::snapshot_seconds)
      .def_prop_ro("total_seconds", &PendingSave::total_seconds)
      .def_prop_ro("bytes", &PendingSave::bytes)
      .def_prop_ro("checksum_seconds", &PendingSave::checksum_seconds)
      .def_prop_ro("base_tag", &PendingSave::base_tag)
      .def_prop_ro("referenced_bytes", &PendingSave::referenced_bytes)
      .def_prop_ro("tier_errors",
                   [](const PendingSave& p) {
                     std::vector<std::string> out;
                     for (const Status& st : p.tier_errors()) out.push_back(st.to_string());
                     return utf8_list(out);
                   })
      .def_prop_ro("retention_error", [](const PendingSave& p) {
        Status st = p.retention_status();
        return st.is_ok() ? std::string() : st.to_string();
      });

  nb::class_<PyCheckpointManager>(m, "CheckpointManager")
      .def(nb::init<const std::string&, const CheckpointOptions&>(), "root"_a, "options"_a)
      .def("save_async", &PyCheckpointManager::save_async, "tag"_a, "tensors"_a, "aliases"_a,
           "objects"_a, "step"_a.none(), "metadata_json"_a, "versions"_a)
      .def("wait_all",
           [](PyCheckpointManager& s) { check(without_gil([&] { return s.get().wait_all(); })); })
      .def("wait_snapshots",
           [](PyCheckpointManager& s) {
             check(without_gil([&] { return s.get().wait_snapshots(); }));
           })
      .def("close", &PyCheckpointManager::close, "drain_timeout"_a.none() = nb::none())
      .def(
          "wait_drains",
          [](PyCheckpointManager& s, std::optional<double> timeout) {
            check(without_gil([&] { return s.get().wait_drains(timeout); }));
          },
          "timeout"_a.none() = nb::none())
      .def("tier_states",
           [](PyCheckpointManager& s) {
             nb::list out;
             for (const TierState& t : s.get().tier_states()) out.append(tier_status(t));
             return out;
           })
      .def("locations",
           [](PyCheckpointManager& s) {
             CheckpointLocations out;
             out.places = unwrap(without_gil([&] { return s.get().locations(&out.unreachable); }));
             return out;
           })
      .def(
          "should_save",
          [](PyCheckpointManager& s, int64_t step) { return unwrap(s.get().should_save(step)); },
          "step"_a)
      .def(
          "pull",
          [](PyCheckpointManager& s, const std::string& tier, const std::string& tag) {
            return unwrap(without_gil([&] { return s.get().pull(tier, tag); }));
          },
          "tier"_a, "tag"_a)
      .def(
          "begin_commit",
          [](PyCheckpointManager& s, const std::string& tag) {
            return unwrap(without_gil([&] { return s.get().begin_commit(tag); }));
          },
          "tag"_a, nb::keep_alive<0, 1>(),
          "Begins a checkpoint that other writers fill (its temporary directory) and this manager "
          "commits.")
      .def_prop_ro("closed", &PyCheckpointManager::closed)
      .def_prop_ro("staging_bytes", [](PyCheckpointManager& s) { return s.get().staging_bytes(); })
      .def("list", [](PyCheckpointManager& s) { return unwrap(s.get().list()); })
      .def("remove",
           [](PyCheckpointManager& s, const std::string& tag) {
             check(without_gil([&] { return s.get().remove(tag); }));
           })
      .def("materialize",
           [](PyCheckpointManager& s, const std::string& tag) {
             return unwrap(without_gil([&] { return s.get().materialize(tag); }));
           })
      .def(
          "prune",
          [](PyCheckpointManager& s, std::optional<unsigned> keep_last,
             std::optional<int64_t> keep_every, bool verify) {
            PruneOutcome out;
            out.removed = unwrap(without_gil(
                [&] { return s.get().prune(keep_last, keep_every, verify, &out.damaged); }));
            return out;
          },
          "keep_last"_a.none(), "keep_every"_a.none(), "verify"_a = false);
}

void bind_checkpoint_reader(nb::module_& m) {
  nb::class_<SplitFileReader>(m, "SplitFile",
                              "A split file of a checkpoint, read in ranges (split_file.h).")
      .def_prop_ro("size", &SplitFileReader::size)
      .def(
          "read_into",
          [](const SplitFileReader& f, uint64_t offset, nb::handle buffer, bool verify) {
            CheckedBuffer b =
                checked_buffer(buffer, MemoryUse::kWrite, MemoryPlace::kHost, "buffer");
            const uint64_t n =
                offset >= f.size() ? 0 : std::min<uint64_t>(b.nbytes, f.size() - offset);
            check(without_gil(
                [&] { return f.read_range(offset, b.data, static_cast<size_t>(n), verify); }));
            return n;
          },
          "offset"_a, "buffer"_a, "verify"_a,
          "Fills `buffer` (writable host memory) with the file's bytes from `offset` on, as many "
          "as "
          "fit and the file has; returns how many (0 at the end).");

  nb::class_<PyCheckpointReader>(m, "CheckpointReader")
      .def(nb::init<const std::string&, const EngineOptions&>(), "dir"_a, "engine_options"_a)
      .def("load", &PyCheckpointReader::load, nb::kw_only(), "names"_a.none(), "destinations"_a,
           "into"_a, "dtype"_a, "dtype_by_name"_a, "strict"_a, "verify"_a, "max_memory"_a,
           "progress"_a.none(), "device_tensors"_a = std::map<size_t, nb::object>(),
           "unconvertible_to_caller"_a = false,
           "A whole load (checkpoint_load.h), keyword arguments only; returns a LoadOutcome.")
      .def("read_objects", &PyCheckpointReader::read_objects)
      .def("open_split_file", &PyCheckpointReader::open_split_file, "name"_a,
           nb::keep_alive<0, 1>(),
           "A split file for reading in ranges (SplitFile); it keeps this reader alive.")
      .def("write_plain_split_file", &PyCheckpointReader::write_plain_split_file, "name"_a,
           "directory"_a, "durable"_a, "checksums"_a, "rank"_a.none(),
           "A split file written back as the new plain file directory/name, streamed (every piece "
           "checked); returns its ManifestFile record.")
      .def("read_file", &PyCheckpointReader::read_file, "name"_a,
           "The whole objects-role file `name`, checksum-checked (KeyError-like NotFound when not "
           "listed).")
      .def_prop_ro("manifest", &PyCheckpointReader::manifest, nb::rv_policy::reference_internal)
      .def_prop_ro("dir", &PyCheckpointReader::dir);
}

// The free functions over a root or one checkpoint: latest, tag rule, verification.
void bind_checkpoint_functions(nb::module_& m) {
  m.def(
      "latest_checkpoint",
      [](const std::string& root) {
        return unwrap(without_gil([&] { return latest_checkpoint(root); }));
      },
      "root"_a);
  m.def(
      "validate_tag", [](const std::string& tag) { check(validate_tag(tag)); }, "tag"_a);
  m.def(
      "verify_checkpoint",
      [](const std::string& dir, const EngineOptions& options, nb::object progress) {
        const std::function<void(uint64_t, uint64_t)> cb = progress_callback(progress);
        auto report = unwrap(without_gil([&]() -> Result<VerifyReport> {
          FP_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> engine, IoEngine::create(options));
          return verify_checkpoint(dir, *engine, cb);
        }));
        return PyVerifyReport{utf8_list(report.problems), report.bytes_checked,
                              report.has_checksums};
      },
      "dir"_a, "engine_options"_a, "progress"_a.none());
}

void bind_safetensors(nb::module_& m) {
  // plan_safetensors_file's answer, read by attribute.
  struct SafetensorsFilePlan {
    nb::bytes header;
    std::vector<size_t> order;
  };
  nb::class_<SafetensorsFilePlan>(m, "SafetensorsFilePlan",
                                  "A safetensors file's layout: its header's bytes, then the "
                                  "tensors' data in `order` (indices into the entries given).")
      .def_ro("header", &SafetensorsFilePlan::header)
      .def_ro("order", &SafetensorsFilePlan::order);
  m.def(
      "plan_safetensors_file",
      [](const std::vector<std::tuple<std::string, std::string, std::vector<uint64_t>>>& entries,
         const std::map<std::string, std::string>& metadata) {
        std::vector<SafetensorsEntry> given;
        for (const auto& [name, dtype, shape] : entries) given.push_back({name, dtype, shape});
        std::vector<size_t> order = widest_first_order(given);
        std::vector<SafetensorsEntry> laid_out;
        for (size_t k : order) laid_out.push_back(given[k]);
        std::string header = unwrap(
            encode_safetensors_header(laid_out, metadata, kSafetensorsDefaultAlignment, nullptr));
        return SafetensorsFilePlan{nb::bytes(header.data(), header.size()), std::move(order)};
      },
      "entries"_a, "metadata"_a,
      "A safetensors file's layout (SafetensorsFilePlan). `entries` are (name, dtype, shape); the "
      "data follows the header in `order` (widest element first), from a 4096-aligned data "
      "section.");
  nb::class_<SafetensorsTensor>(m, "SafetensorsTensor", "One tensor of a safetensors header.")
      .def_prop_ro("name", [](const SafetensorsTensor& t) { return utf8_str(t.name); })
      .def_ro("dtype", &SafetensorsTensor::dtype)
      .def_ro("shape", &SafetensorsTensor::shape)
      .def_ro("begin", &SafetensorsTensor::begin, "data_offsets[0], relative to the data section.")
      .def_ro("end", &SafetensorsTensor::end);
  nb::class_<SafetensorsHeader>(m, "SafetensorsHeader",
                                "A safetensors file's validated header (safetensors.h).")
      .def_ro("tensors", &SafetensorsHeader::tensors, "In data order.")
      .def_ro("metadata", &SafetensorsHeader::metadata)
      .def_ro("data_start", &SafetensorsHeader::data_start,
              "Absolute file offset of the data section.")
      .def_ro("data_bytes", &SafetensorsHeader::data_bytes);
  m.def(
      "read_safetensors_header",
      [](const std::string& path) {
        return unwrap(without_gil([&] { return read_safetensors_header(path); }));
      },
      "path"_a);
}

}  // namespace

void bind_checkpoint(nb::module_& m) {
  bind_checkpoint_options(m);
  bind_checkpoint_manager(m);
  bind_checkpoint_reader(m);
  bind_checkpoint_functions(m);
  bind_safetensors(m);
}

}  // namespace fastpersist::python
