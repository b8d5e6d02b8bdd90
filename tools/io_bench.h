// SPDX-License-Identifier: Apache-2.0
// Pieces of `fastpersist io-bench` shared by its files: arguments (io_bench_args.cc), the timed
// loops (io_bench_command.cc) and the text/JSON output (io_bench_output.cc).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fastpersist/io_engine.h"
#include "fastpersist/options.h"
#include "fastpersist/status.h"

namespace fastpersist::cli::io_bench {

inline constexpr const char* kFileName = "fastpersist-io-bench.dat";
inline constexpr double kBytesPerGB = 1e9;  // storage vendors' and fio's GB, not GiB

// The command line as CLI11 parsed it.
struct Args {
  std::string folder;
  std::string size = "4GiB";
  bool read = false;
  bool write = false;
  std::string backend = "auto";
  std::string block_size = "8M";
  unsigned queue_depth = 32;
  unsigned parallelism = 1;
  bool single_submit = false;
  bool overlap_events = false;
  bool sequential = false;
  unsigned loops = 3;
  bool no_direct = false;
  bool json = false;
  bool keep = false;
  CLI::App* app = nullptr;
  bool given(const char* flag) const { return app->count(flag) > 0; }
};

// What the run does, validated.
struct Settings {
  bool write = true;
  uint64_t size = 0;
  std::string folder;
  std::string path;
  EngineOptions options;
};

struct Loop {
  double seconds = 0;        // the whole timed step
  double fsync_seconds = 0;  // part of `seconds` spent in fsync (writes)
};

// What the run measured.
struct Outcome {
  std::vector<Loop> loops;
  std::string backend;
  std::string backend_reason;
  FileIoMode mode;
  bool buffer_locked = false;
  IoStats stats;  // of the timed loops only
};

// The timed steps, shared with `fastpersist tune`. A write makes a fresh file of `size` bytes
// from `buffer` and fsyncs it (both in loop->seconds); a read evicts the file from the page
// cache, then reads `size` bytes of it. prepare_read_file writes the file a read needs unless
// one at least `size` long is there.
Status timed_write(IoEngine& engine, const std::string& path, std::byte* buffer, uint64_t size,
                   Loop* loop);
Status timed_read(IoEngine& engine, const std::string& path, std::byte* buffer, uint64_t size,
                  Loop* loop);
Status prepare_read_file(IoEngine& engine, const std::string& path, std::byte* buffer,
                         uint64_t size, bool verbose);

// Checks the arguments and resolves the engine options; kInvalidArgument says what is wrong.
// io-bench's engine settings before the environment, a configuration file or a flag changes
// them: 8 MiB blocks, queue depth 32, one thread, overlapped events. tune starts its search here.
EngineOptions default_engine_options();
Result<Settings> validate(const Args& a);

double gb_per_s(uint64_t bytes, double seconds);
nlohmann::json to_json(const Settings& s, const Outcome& out, double best);
void print_header(const Settings& s, const Outcome& out, unsigned loops);
void print_footer(const Outcome& out, double best);

}  // namespace fastpersist::cli::io_bench
