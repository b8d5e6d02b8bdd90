// SPDX-License-Identifier: Apache-2.0
// `fastpersist io-bench`: how fast the engine moves one large buffer to or from a file, like
// DeepSpeed's `ds_io`, and comparable with `fio --direct=1 --end_fsync=1`: every timed write
// loop includes the fsync that makes the data durable, and every timed read starts cold.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "bench_file.h"
#include "command.h"
#include "fastpersist/io_engine.h"
#include "fastpersist/options.h"
#include "fastpersist/pinned_buffer.h"
#include "format.h"
#include "io_bench.h"

namespace fastpersist::cli {

namespace io_bench {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

Status timed_write(IoEngine& engine, const std::string& path, std::byte* buffer, uint64_t size,
                   Loop* loop) {
  auto start = std::chrono::steady_clock::now();
  // A fresh file each loop, as before the engine stopped truncating by default: a rewrite of
  // allocated blocks would measure a different (faster) path than the first write.
  IoRequest request{IoKind::kWrite, buffer, size, path, -1, 0};
  request.truncate = true;
  Result<uint64_t> n = engine.run(request);
  if (!n.is_ok()) return n.status();
  auto sync_start = std::chrono::steady_clock::now();
  FP_RETURN_IF_ERROR(fsync_path(path));
  if (loop != nullptr) {
    loop->fsync_seconds = seconds_since(sync_start);
    loop->seconds = seconds_since(start);
  }
  return Status::ok();
}

Status timed_read(IoEngine& engine, const std::string& path, std::byte* buffer, uint64_t size,
                  Loop* loop) {
  FP_RETURN_IF_ERROR(evict_from_page_cache(path));
  auto start = std::chrono::steady_clock::now();
  Result<uint64_t> n = engine.run({IoKind::kRead, buffer, size, path, -1, 0});
  loop->seconds = seconds_since(start);
  return n.status();
}

Status prepare_read_file(IoEngine& engine, const std::string& path, std::byte* buffer,
                         uint64_t size, bool verbose) {
  FP_ASSIGN_OR_RETURN(std::optional<uint64_t> existing, regular_file_size(path));
  if (existing && *existing >= size) return Status::ok();
  if (verbose) {
    std::cout << "preparing: writing " << format_bytes(size) << " to " << path << "\n";
  }
  FP_RETURN_IF_ERROR(remove_file(path));
  return timed_write(engine, path, buffer, size, nullptr);
}

}  // namespace io_bench

namespace {

using namespace io_bench;

Status run_loop(IoEngine& engine, const Settings& s, std::byte* buffer, Loop* loop) {
  if (s.write) {
    FP_RETURN_IF_ERROR(remove_file(s.path));  // a new file each loop, as ds_io does
    return timed_write(engine, s.path, buffer, s.size, loop);
  }
  return timed_read(engine, s.path, buffer, s.size, loop);
}

int fail(const std::string& message, int code) {
  std::cout.flush();
  std::cerr << "fastpersist io-bench: error: " << message << "\n";
  return code;
}

int run(const Args& args) {
  Result<Settings> settings = validate(args);
  if (!settings.is_ok()) return fail(settings.status().message(), kExitUsage);
  const Settings& s = *settings;
  const bool text = !args.json;

  Result<std::unique_ptr<IoEngine>> engine = IoEngine::create(s.options);
  if (!engine.is_ok()) return fail(engine.status().to_string(), kExitFailure);
  Outcome out;
  out.backend = (*engine)->backend_name();
  out.backend_reason = (*engine)->backend_reason();
  Result<FileIoMode> mode = probe_file_io(s.folder);
  if (!mode.is_ok()) return fail(mode.status().to_string(), kExitFailure);
  out.mode = *mode;

  Result<PinnedBuffer> buffer = PinnedBuffer::allocate(static_cast<size_t>(s.size));
  if (!buffer.is_ok()) {
    return fail("cannot allocate the buffer: " + buffer.status().to_string(), kExitFailure);
  }
  out.buffer_locked = buffer->locked();
  fill_pseudo_random(buffer->data(), static_cast<size_t>(s.size), 0x9e3779b97f4a7c15ULL);
  if (text) print_header(s, out, args.loops);

  Status st;
  if (!s.write) st = prepare_read_file(**engine, s.path, buffer->data(), s.size, text);
  IoStats before = (*engine)->stats();
  double best = 0;
  for (unsigned i = 1; st.is_ok() && i <= args.loops; ++i) {
    Loop loop;
    st = run_loop(**engine, s, buffer->data(), &loop);
    if (!st.is_ok()) break;
    out.loops.push_back(loop);
    const double rate = gb_per_s(s.size, loop.seconds);
    best = std::max(best, rate);
    if (text) {
      std::cout << "loop " << i << ": " << format_fixed(rate, 2) << " GB/s ("
                << format_fixed(loop.seconds, 2) << " s)\n";
      std::cout.flush();
    }
  }
  IoStats after = (*engine)->stats();
  out.stats = after;
  out.stats.direct_bytes -= before.direct_bytes;
  out.stats.buffered_bytes -= before.buffered_bytes;
  out.stats.bounce_bytes -= before.bounce_bytes;
  out.stats.short_transfers -= before.short_transfers;
  out.stats.direct_fallbacks -= before.direct_fallbacks;

  Status cleanup = args.keep ? Status::ok() : remove_file(s.path);
  if (!st.is_ok()) return fail(st.to_string(), kExitFailure);
  if (!cleanup.is_ok()) return fail(cleanup.to_string(), kExitFailure);
  if (text) {
    print_footer(out, best);
  } else {
    std::cout << json_text(to_json(s, out, best)) << "\n";
  }
  return kExitOk;
}

}  // namespace

Command add_io_bench_command(CLI::App& parent) {
  auto args = std::make_shared<Args>();
  CLI::App* app = parent.add_subcommand(
      "io-bench",
      "Time writing or reading one large buffer to/from a file (like DeepSpeed's ds_io)");
  args->app = app;
  app->add_option("--folder", args->folder, "Folder to create the benchmark file in")->required();
  app->add_option("--size", args->size, "Bytes per loop, e.g. 64MiB, 4GiB")->capture_default_str();
  auto* read =
      app->add_flag("--read", args->read, "Benchmark reads (writes the file first if needed)");
  auto* write = app->add_flag("--write", args->write, "Benchmark writes (the default)");
  read->excludes(write);
  app->add_option("--backend", args->backend, "auto, io_uring, libaio or threads")
      ->capture_default_str();
  app->add_option("--block-size", args->block_size, "Bytes per I/O request, e.g. 1M, 8M")
      ->capture_default_str();
  app->add_option("--queue-depth", args->queue_depth, "Requests in flight per worker")
      ->capture_default_str();
  app->add_option("--parallelism", args->parallelism, "Worker threads (intra_op_parallelism)")
      ->capture_default_str();
  app->add_flag("--single-submit", args->single_submit, "One submit call per request");
  auto* overlap = app->add_flag("--overlap-events", args->overlap_events,
                                "Keep the queue topped up (sliding window; the default)");
  auto* sequential = app->add_flag("--sequential", args->sequential,
                                   "Lock-step batches: submit a batch, wait for all of it");
  overlap->excludes(sequential);
  app->add_option("--loops", args->loops, "Timed loops; the best is reported")
      ->check(CLI::Range(1u, 100000u))
      ->capture_default_str();
  app->add_flag("--no-direct", args->no_direct, "Use the page cache instead of O_DIRECT");
  app->add_flag("--json", args->json, "Print one JSON object instead of text");
  app->add_flag("--keep", args->keep, "Keep the benchmark file afterwards");
  return {app, [args] { return run(*args); }};
}

}  // namespace fastpersist::cli
