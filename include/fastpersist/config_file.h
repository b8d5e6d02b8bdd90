// SPDX-License-Identifier: Apache-2.0
// Configuration files: the I/O settings `fastpersist tune --output fastpersist.json` found best
// for a machine, read back by the library, the Python package and every CLI command
// (docs/settings.md, "Configuration files").
//
//   {"format": "fastpersist-config", "version": 1,
//    "engine": {"backend": "io_uring", "block_size": 8388608, "queue_depth": 32,
//               "intra_op_parallelism": 2, "single_submit": false, "overlap_events": true,
//               "direct_io": true, "direct_io_min_bytes": 65536},
//    "writer": {"io_buffer_bytes": 67108864},
//    "tuned": {...}}
//
// Every field of "engine" and "writer" is optional (absent: the default, or what the caller
// started from); sizes are numbers of bytes or strings such as "8MiB". An unknown key, a value
// of the wrong type or out of range is an error naming the file and the field: a typo never
// leaves a setting silently at its default. "tuned" (what tune measured) is free-form.
//
// Precedence, lowest first: built-in defaults, the configuration file (the one
// use_config_file() made active, else the one FASTPERSIST_CONFIG names), the individual
// FASTPERSIST_* variables, then explicit arguments.
//
// Thread-safety: parse/read functions are pure; the active configuration is guarded by a mutex.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "fastpersist/options.h"
#include "fastpersist/status.h"

namespace fastpersist {

inline constexpr std::string_view kConfigFormatName = "fastpersist-config";
inline constexpr int kConfigFormatVersion = 1;
inline constexpr const char* kConfigEnvVariable = "FASTPERSIST_CONFIG";
inline constexpr size_t kMaxConfigFileBytes = size_t{1} << 20;

struct ConfigFile {
  EngineOptions engine;
  // The staging buffer of FastFileWriter (FastFileWriterOptions::io_buffer_bytes), if set.
  std::optional<size_t> writer_io_buffer_bytes;
  std::string path;  // where it was read from ("" when parsed from text)
};

// Parses a configuration's text over `base`; `what` names it in messages. kInvalidArgument.
Result<ConfigFile> parse_config(std::string_view json, const std::string& what,
                                const EngineOptions& base = {});
// Reads and parses the file at `path` (a regular file of at most kMaxConfigFileBytes).
Result<ConfigFile> read_config_file(const std::string& path, const EngineOptions& base = {});
// The text of a configuration (what `tune --output` writes); `tuned_json` ("" or a JSON
// object) becomes its "tuned" field.
std::string encode_config(const EngineOptions& engine, std::optional<size_t> writer_io_buffer_bytes,
                          const std::string& tuned_json = "");

// Makes the file at `path` the process's configuration (read and checked now; "" goes back to
// FASTPERSIST_CONFIG). Returns what it holds.
Result<ConfigFile> use_config_file(const std::string& path);
// The active configuration applied over `base`: the file use_config_file() chose, else the one
// FASTPERSIST_CONFIG names, else none (returns `base`, no writer size).
Result<ConfigFile> active_config(const EngineOptions& base = {});

}  // namespace fastpersist
