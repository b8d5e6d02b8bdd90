// SPDX-License-Identifier: Apache-2.0
// EngineOptions (the one defaults table), size parsing, backend probes, statistics and the
// folder probe: the read-mostly facts the Python facade and `fastpersist.backends()` show.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "bindings.h"
#include "fastpersist/config_file.h"
#include "fastpersist/io_backend.h"
#include "fastpersist/io_engine.h"
#include "fastpersist/options.h"
#include "fastpersist/pinned_buffer.h"

namespace fastpersist::python {
namespace {

using namespace nb::literals;

void bind_engine_options(nb::module_& m) {
  nb::class_<EngineOptions>(m, "EngineOptions", "Engine knobs; defaults are DeepNVMe's.")
      .def(nb::init<>())
      .def_prop_rw(
          "backend", [](const EngineOptions& o) { return std::string(backend_name(o.backend)); },
          [](EngineOptions& o, const std::string& name) {
            o.backend = unwrap(parse_backend(name));
          })
      .def_rw("block_size", &EngineOptions::block_size)
      .def_rw("queue_depth", &EngineOptions::queue_depth)
      .def_rw("single_submit", &EngineOptions::single_submit)
      .def_rw("overlap_events", &EngineOptions::overlap_events)
      .def_rw("intra_op_parallelism", &EngineOptions::intra_op_parallelism)
      .def_rw("direct_io", &EngineOptions::direct_io)
      .def_rw("direct_io_min_bytes", &EngineOptions::direct_io_min_bytes)
      .def("validate", [](const EngineOptions& o) { check(o.validate()); });
}

// The configuration file and the environment over it; the size parsers.
void bind_config(nb::module_& m) {
  m.def(
      "engine_options_from_env",
      [](const EngineOptions& base) { return unwrap(engine_options_from_env(base)); }, "base"_a,
      "Applies the active configuration file, then the FASTPERSIST_* environment variables, on top "
      "of `base`.");
  nb::class_<ConfigFile>(m, "ConfigFile", "A configuration file's settings (config_file.h).")
      .def_ro("engine", &ConfigFile::engine)
      .def_ro("writer_io_buffer_bytes", &ConfigFile::writer_io_buffer_bytes)
      .def_ro("path", &ConfigFile::path);
  m.def(
      "use_config_file",
      [](const std::string& path) {
        return unwrap(without_gil([&] { return use_config_file(path); }));
      },
      "path"_a,
      "Makes the configuration file at `path` the process's ('' goes back to FASTPERSIST_CONFIG).");
  m.def(
      "active_config",
      [](const EngineOptions& base) {
        return unwrap(without_gil([&] { return active_config(base); }));
      },
      "base"_a, "The active configuration applied over `base`.");
  m.def(
      "parse_size", [](const std::string& text) { return unwrap(parse_size(text)); }, "text"_a,
      "Parses '4096', '64KiB', '8M', '1GiB' into bytes (K/M/G/T are powers of 1024).");
  m.def(
      "parse_hf_size", [](const std::string& text) { return unwrap(parse_hf_size(text)); },
      "text"_a, "Parses a size as Hugging Face means it: '5GB' is 5*10^9 bytes, '5GiB' 5*2^30.");
  nb::class_<SettingRecord>(m, "Setting",
                            "One setting of a C++ settings table: its keyword, the option field "
                            "it sets and the kind of value it takes.")
      .def_ro("name", &SettingRecord::name)
      .def_ro("field", &SettingRecord::field)
      .def_ro("kind", &SettingRecord::kind)
      .def("__repr__", [](const SettingRecord& r) {
        return "Setting(" + r.name + ", field=" + r.field + ", kind=" + r.kind + ")";
      });
  // kEngineSettings as Setting records (field = name): what the Python option builder goes by.
  nb::list settings;
  for (const EngineSetting& setting : kEngineSettings) {
    settings.append(nb::cast(SettingRecord{std::string(setting.name), std::string(setting.name),
                                           std::string(setting_kind_name(setting.kind))}));
  }
  m.attr("ENGINE_SETTINGS") = nb::tuple(settings);
}

void bind_backend_probes(nb::module_& m) {
  auto probe = nb::class_<BackendProbe>(
      m, "BackendInfo",
      "One I/O backend: whether it was compiled in, whether it runs here, and if not why.");
  probe
      .def_prop_ro("name",
                   [](const BackendProbe& p) { return std::string(backend_name(p.backend)); })
      .def_ro("built_in", &BackendProbe::built_in)
      .def_ro("available", &BackendProbe::available)
      .def_ro("reason", &BackendProbe::reason)
      .def_ro("fix", &BackendProbe::fix, "What to do to make it available (\"\" when it is).")
      .def("__repr__", [](const BackendProbe& p) {
        return nb::str("BackendInfo(name={!r}, built_in={}, available={}, reason={!r})")
            .format(std::string(backend_name(p.backend)), p.built_in, p.available, p.reason);
      });
  auto probe_state = [](const BackendProbe& p) {
    return std::make_tuple(std::string(backend_name(p.backend)), p.built_in, p.available, p.reason,
                           p.fix);
  };
  comparable(probe, probe_state, probe_state);
  m.def("probe_all_backends", [] {
    auto probes = without_gil([] { return probe_all_backends(); });
    return std::vector<BackendProbe>(probes.begin(), probes.end());
  });
  m.def(
      "resolve_backend",
      [](const std::string& name) {
        Backend requested = unwrap(parse_backend(name));
        std::string why;
        Result<Backend> r = without_gil([&] { return resolve_backend(requested, &why); });
        Backend chosen = unwrap(std::move(r));
        return std::make_pair(std::string(backend_name(chosen)), why);
      },
      "name"_a, "The backend `name` resolves to on this machine, and why.");
}

void bind_io_stats(nb::module_& m) {
  auto stats =
      nb::class_<IoStats>(m, "IoStats", "Counters of one handle's engine since it was created.");
  stats.def_ro("requests", &IoStats::requests)
      .def_ro("bytes_written", &IoStats::bytes_written)
      .def_ro("bytes_read", &IoStats::bytes_read)
      .def_ro("direct_bytes", &IoStats::direct_bytes)
      .def_ro("buffered_bytes", &IoStats::buffered_bytes)
      .def_ro("bounce_bytes", &IoStats::bounce_bytes)
      .def_ro("short_transfers", &IoStats::short_transfers)
      .def_ro("direct_fallbacks", &IoStats::direct_fallbacks)
      .def_ro("last_fallback_reason", &IoStats::last_fallback_reason)
      .def("__repr__", [](const IoStats& st) {
        return nb::str(
                   "IoStats(requests={}, bytes_written={}, bytes_read={}, direct_bytes={}, "
                   "buffered_bytes={}, "
                   "bounce_bytes={}, short_transfers={}, direct_fallbacks={}, "
                   "last_fallback_reason={!r})")
            .format(st.requests, st.bytes_written, st.bytes_read, st.direct_bytes,
                    st.buffered_bytes, st.bounce_bytes, st.short_transfers, st.direct_fallbacks,
                    st.last_fallback_reason);
      });
  auto stats_state = [](const IoStats& st) {
    return std::make_tuple(st.requests, st.bytes_written, st.bytes_read, st.direct_bytes,
                           st.buffered_bytes, st.bounce_bytes, st.short_transfers,
                           st.direct_fallbacks, st.last_fallback_reason);
  };
  comparable(stats, stats_state, stats_state);
}

void bind_file_io_mode(nb::module_& m) {
  auto mode = nb::class_<FileIoMode>(
      m, "FileIoMode",
      "How the engine opens files in a folder: O_DIRECT or not (and why), alignment.");
  mode.def_ro("direct", &FileIoMode::direct)
      .def_ro("fallback_reason", &FileIoMode::fallback_reason)
      .def_ro("offset_alignment", &FileIoMode::offset_alignment)
      .def_ro("memory_alignment", &FileIoMode::memory_alignment)
      .def("__repr__", [](const FileIoMode& f) {
        return nb::str(
                   "FileIoMode(direct={}, fallback_reason={!r}, offset_alignment={}, "
                   "memory_alignment={})")
            .format(f.direct, f.fallback_reason, f.offset_alignment, f.memory_alignment);
      });
  auto mode_state = [](const FileIoMode& f) {
    return std::make_tuple(f.direct, f.fallback_reason, f.offset_alignment, f.memory_alignment);
  };
  comparable(mode, mode_state, mode_state);
  m.def(
      "probe_file_io",
      [](const std::string& path) {
        Result<FileIoMode> r = without_gil([&] { return probe_file_io(path); });
        return unwrap(std::move(r));
      },
      "path"_a, "How the engine would open `path` (a file or a folder) for writing.");
}

// Pinned-memory limits and the CUDA runtime, as `fastpersist report` shows them.
void bind_memory_probes(nb::module_& m) {
  nb::class_<MemlockInfo>(m, "MemlockInfo")
      .def_ro("soft_limit", &MemlockInfo::soft_limit)
      .def_ro("hard_limit", &MemlockInfo::hard_limit)
      .def_ro("warned", &MemlockInfo::warned);
  m.def("memlock_info", [] { return memlock_info(); });

  nb::class_<CudaRuntimeInfo>(m, "CudaRuntimeInfo")
      .def_ro("available", &CudaRuntimeInfo::available)
      .def_ro("library", &CudaRuntimeInfo::library)
      .def_ro("reason", &CudaRuntimeInfo::reason);
  m.def("cuda_runtime_info", [] { return without_gil([] { return cuda_runtime_info(); }); });
  m.def(
      "cuda_device_copy_status",
      [](int device) {
        Status st = without_gil([&] { return cuda_device_copy_ready(device); });
        return st.is_ok() ? std::string() : st.to_string();
      },
      "device"_a,
      "'' when checkpoint snapshots can copy from CUDA device `device` (in C++, into pinned "
      "staging); otherwise why not.");
}

}  // namespace

void bind_options(nb::module_& m) {
  bind_engine_options(m);
  bind_config(m);
  bind_backend_probes(m);
  bind_io_stats(m);
  bind_file_io_mode(m);
  bind_memory_probes(m);
}

}  // namespace fastpersist::python
