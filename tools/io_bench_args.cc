// SPDX-License-Identifier: Apache-2.0
// `fastpersist io-bench` argument checks: every mistake is reported before anything is allocated
// or written, with the flag (or environment variable) that caused it.
#include <unistd.h>

#include <filesystem>
#include <string>

#include "format.h"
#include "io_bench.h"

namespace fastpersist::cli::io_bench {
namespace {

Status usage(std::string message) {
  return Status(StatusCode::kInvalidArgument, std::move(message));
}

}  // namespace

EngineOptions default_engine_options() {
  EngineOptions o;
  o.block_size = size_t{8} << 20;
  o.queue_depth = 32;
  o.intra_op_parallelism = 1;
  o.overlap_events = true;
  return o;
}

// Io-bench's defaults (ds_io's, with fio's 8M blocks), then FASTPERSIST_* variables, then flags:
// an explicit flag always wins, so a benchmark line is reproducible whatever the environment.
Result<Settings> validate(const Args& a) {
  Settings s;
  s.write = !a.read;
  Result<uint64_t> size = parse_size(a.size);
  if (!size.is_ok()) return usage("invalid --size: " + size.status().message());
  if (*size == 0) return usage("invalid --size: must be at least 1 byte");
  s.size = *size;
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page_size > 0) {
    const auto ram = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
    if (s.size > ram / 10 * 9) {
      return usage("--size " + format_bytes(s.size) + " does not fit in memory (" +
                   format_bytes(ram) + " RAM): io-bench holds the whole transfer in one buffer");
    }
  }

  std::error_code ec;
  if (!std::filesystem::is_directory(a.folder, ec)) {
    return usage("--folder '" + a.folder + "': " +
                 (std::filesystem::exists(a.folder, ec) ? "not a directory" : "no such directory"));
  }
  std::filesystem::path folder = std::filesystem::absolute(a.folder, ec).lexically_normal();
  s.folder = folder.string();
  if (!s.folder.empty() && s.folder.size() > 1 && s.folder.back() == '/') s.folder.pop_back();
  s.path = (folder / kFileName).string();

  Result<EngineOptions> from_env = engine_options_from_env(default_engine_options());
  if (!from_env.is_ok()) {
    const std::string& m = from_env.status().message();
    return usage(m.find("environment variable") != std::string::npos
                     ? m
                     : "invalid engine settings from the FASTPERSIST_* environment variables: " +
                           m);
  }
  EngineOptions o = *from_env;
  if (a.given("--backend")) {
    Result<Backend> b = parse_backend(a.backend);
    if (!b.is_ok()) return usage("invalid --backend: " + b.status().message());
    o.backend = *b;
  }
  if (a.given("--block-size")) {
    Result<uint64_t> bs = parse_size(a.block_size);
    if (!bs.is_ok()) return usage("invalid --block-size: " + bs.status().message());
    o.block_size = static_cast<size_t>(*bs);
  }
  if (a.given("--queue-depth")) o.queue_depth = a.queue_depth;
  if (a.given("--parallelism")) o.intra_op_parallelism = a.parallelism;
  if (a.given("--single-submit")) o.single_submit = true;
  if (a.given("--overlap-events")) o.overlap_events = true;
  if (a.given("--sequential")) o.overlap_events = false;
  if (a.given("--no-direct")) o.direct_io = false;
  Status valid = o.validate();
  if (!valid.is_ok()) {
    // Name where the bad value came from: a flag on this line or a variable set long ago.
    struct Source {
      const char* field;
      const char* flag;
      const char* env;
    };
    std::string source;
    for (const Source& src :
         {Source{"block_size", "--block-size", "FASTPERSIST_BLOCK_SIZE"},
          Source{"queue_depth", "--queue-depth", "FASTPERSIST_QUEUE_DEPTH"},
          Source{"intra_op_parallelism", "--parallelism", "FASTPERSIST_INTRA_OP_PARALLELISM"}}) {
      if (valid.message().rfind(src.field, 0) == 0) {
        source = std::string(" (set by ") + (a.given(src.flag) ? src.flag : src.env) + ")";
      }
    }
    return usage("invalid engine settings: " + valid.message() + source);
  }
  s.options = o;
  return s;
}

}  // namespace fastpersist::cli::io_bench
