// SPDX-License-Identifier: Apache-2.0
// Engine options and their defaults: the one table that C++, environment variables, the CLI
// and Python all use. docs/settings.md documents every field; a test keeps them in agreement.
//
// The knobs carry DeepNVMe's meaning so DeepSpeed users can move their tuned values over:
//   block_size           bytes per I/O request submitted to the kernel
//   queue_depth          requests in flight per worker
//   intra_op_parallelism workers; each takes one contiguous slice of every request
//   single_submit        one submit syscall per request instead of one per batch
//   overlap_events       keep the queue topped up (sliding window) instead of lock-step batches
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "fastpersist/status.h"

namespace fastpersist {

// Which kernel interface moves the bytes. Values are stable (they appear in reports and JSON).
enum class Backend : int {
  kAuto = 0,     // probe at run time: io_uring > libaio > threads
  kIoUring = 1,  // liburing
  kLibaio = 2,   // Linux native AIO (libaio)
  kThreads = 3,  // POSIX pread/pwrite on a pool of threads
};

std::string_view backend_name(Backend b);  // "auto", "io_uring", "libaio", "threads"
Result<Backend> parse_backend(std::string_view name);

struct EngineOptions {
  Backend backend = Backend::kAuto;
  size_t block_size = size_t{1} << 20;  // 1 MiB, DeepNVMe's aio_handle default
  unsigned queue_depth = 128;
  bool single_submit = false;
  bool overlap_events = false;
  unsigned intra_op_parallelism = 1;
  // O_DIRECT for transfers of at least `direct_io_min_bytes`; smaller ones go through the page
  // cache, where O_DIRECT would only add latency.
  bool direct_io = true;
  size_t direct_io_min_bytes = size_t{64} << 10;

  // Checks ranges (block_size > 0, queue_depth in [1, 65536], parallelism in [1, 1024], ...).
  Status validate() const;
};

// How a setting's value is written: a backend name, a byte count ("8MiB" in text), a count, a
// flag; for CheckpointOptions (kCheckpointSettings, checkpoint.h) also a codec name, a signed
// codec level and a number of seconds.
enum class SettingKind { kBackend, kBytes, kCount, kFlag, kCodec, kLevel, kSeconds };

// A SettingKind by the name the Python package and the docs use ("bytes", "count", ...).
constexpr std::string_view setting_kind_name(SettingKind kind) {
  switch (kind) {
    case SettingKind::kBackend:
      return "backend";
    case SettingKind::kBytes:
      return "bytes";
    case SettingKind::kCount:
      return "count";
    case SettingKind::kFlag:
      return "flag";
    case SettingKind::kCodec:
      return "codec";
    case SettingKind::kLevel:
      return "level";
    case SettingKind::kSeconds:
      return "seconds";
  }
  return "?";
}

struct EngineSetting {
  std::string_view name;
  SettingKind kind;
};

// Every EngineOptions setting by the name its users give it (a Python keyword, a key of the
// configuration file's "engine" object, FASTPERSIST_<NAME> in upper case), in the order the
// configuration file writes them (DeepNVMe's knobs first). The one list of those names: the
// configuration file's reader and the Python package's option builder (_core.ENGINE_SETTINGS) go by
// it, and a test holds it to the struct above.
inline constexpr EngineSetting kEngineSettings[] = {
    {"backend", SettingKind::kBackend},    {"block_size", SettingKind::kBytes},
    {"queue_depth", SettingKind::kCount},  {"intra_op_parallelism", SettingKind::kCount},
    {"single_submit", SettingKind::kFlag}, {"overlap_events", SettingKind::kFlag},
    {"direct_io", SettingKind::kFlag},     {"direct_io_min_bytes", SettingKind::kBytes},
};

// Applies the active configuration file (config_file.h: use_config_file(), else
// FASTPERSIST_CONFIG) and then the FASTPERSIST_* environment variables on top of `base` (see
// docs/settings.md). Unknown values are an error, not silently ignored.
Result<EngineOptions> engine_options_from_env(EngineOptions base = {});

// Parses "4096", "64KiB", "8M", "1GiB", "2g" into bytes. K/M/G/T are powers of 1024.
Result<uint64_t> parse_size(std::string_view text);
// Parses a size as Hugging Face means it (transformers' convert_file_size_to_int, e.g. a
// `max_shard_size`): "5GB" is 5 * 10^9 bytes, "5GiB" 5 * 2^30, KB/MB/GB decimal and
// KiB/MiB/GiB binary (any case), a final lowercase "b" ("5Gb") counts bits; a plain number is
// bytes.
Result<uint64_t> parse_hf_size(std::string_view text);

}  // namespace fastpersist
