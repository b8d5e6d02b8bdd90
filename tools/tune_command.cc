// SPDX-License-Identifier: Apache-2.0
// `fastpersist tune --folder F [--size 1GiB] [--budget 120s] [--write|--read|--both]
// [--output fastpersist.json] [--json]`: finds the engine settings that move bytes fastest on the
// storage under F, as DeepSpeed's `ds_nvme_tune` does, within a time budget (tune_search.h:
// coordinate descent with pruning, then the contenders repeated and ranked by their median).
// Writes are timed like io-bench's (a fresh file, fsync included), reads start cold. For writes,
// FastFileWriter's staging size is searched too, with the best engine settings, on a stream of
// 256 KiB writes (the pieces that go through staging; larger aligned ones are written from the
// caller's memory). The best settings are written as a configuration file (config_file.h) and
// printed as the "aio" section of a DeepSpeed config.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench_file.h"
#include "checkpoint_paths.h"
#include "command.h"
#include "common/progress.h"
#include "fastpersist/config_file.h"
#include "fastpersist/fast_file_writer.h"
#include "fastpersist/io_backend.h"
#include "fastpersist/io_engine.h"
#include "fastpersist/pinned_buffer.h"
#include "format.h"
#include "io_bench.h"
#include "python_exec.h"
#include "tune_search.h"

namespace fastpersist::cli {
namespace {

// Writes the configuration the way fastpersist writes every file: into a temporary next to it,
// made durable, then renamed over it (FastFileWriter), so a crash leaves the old file or the new.
Status write_config_file(const std::string& path, const std::string& text) {
  FastFileWriterOptions options;
  options.io_buffer_bytes = size_t{64} << 10;  // a few KiB of JSON
  options.preallocate_max_bytes = 0;
  FP_ASSIGN_OR_RETURN(std::unique_ptr<FastFileWriter> writer, FastFileWriter::open(path, options));
  FP_RETURN_IF_ERROR(writer->write(text.data(), text.size()));
  return writer->close();
}

constexpr const char* kCommand = "tune";
constexpr const char* kFileName = "fastpersist-tune.dat";
constexpr size_t kWriterPiece = size_t{256} << 10;
constexpr size_t kShownRows = 8;

struct Args {
  std::string folder;
  std::string size = "1GiB";
  std::string budget = "120s";
  bool write = false;
  bool read = false;
  bool both = false;
  std::string output;
  std::string plot;
  bool json = false;
  bool progress = false;
  bool no_progress = false;
};

// "120", "120s", "2m", "1.5h" as seconds.
Result<double> parse_duration(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  double scale = unit.empty() || unit == "s"    ? 1
                 : unit == "m" || unit == "min" ? 60
                 : unit == "h"                  ? 3600
                                                : 0;
  if (used == 0 || scale == 0 || !std::isfinite(value) || value <= 0 || value * scale > 7 * 86400) {
    return Status(StatusCode::kInvalidArgument,
                  "invalid --budget '" + text +
                      "' (a positive duration such as 120s, 5m or 1h, at most a week)");
  }
  return value * scale;
}

std::string describe(const tune::Candidate& c, bool with_writer) {
  std::ostringstream o;
  o << backend_name(c.engine.backend) << ", block " << format_bytes(c.engine.block_size)
    << ", queue depth " << c.engine.queue_depth << ", parallelism " << c.engine.intra_op_parallelism
    << ", single_submit " << on_off(c.engine.single_submit) << ", overlap_events "
    << on_off(c.engine.overlap_events);
  if (with_writer && c.writer_buffer != 0)
    o << ", writer staging " << format_bytes(c.writer_buffer);
  return o.str();
}

nlohmann::ordered_json candidate_json(const tune::Candidate& c) {
  nlohmann::ordered_json j = {{"backend", std::string(backend_name(c.engine.backend))},
                              {"block_size", c.engine.block_size},
                              {"queue_depth", c.engine.queue_depth},
                              {"intra_op_parallelism", c.engine.intra_op_parallelism},
                              {"single_submit", c.engine.single_submit},
                              {"overlap_events", c.engine.overlap_events}};
  if (c.writer_buffer != 0) j["writer_io_buffer_bytes"] = c.writer_buffer;
  return j;
}

// DeepSpeed's config keys for the same knobs (docs: deepspeed.ai "aio" section).
nlohmann::ordered_json deepspeed_aio(const EngineOptions& e) {
  return {{"aio",
           {{"block_size", e.block_size},
            {"queue_depth", e.queue_depth},
            {"intra_op_parallelism", e.intra_op_parallelism},
            {"single_submit", e.single_submit},
            {"overlap_events", e.overlap_events},
            {"use_gds", false}}}};
}

// One phase's result: what was searched, and how it ranked.
struct Phase {
  std::string name;  // "write", "read", "writer staging"
  tune::Outcome outcome;
};

class Tuner {
 public:
  Tuner(const Args& a, std::string folder, uint64_t size, double budget)
      : a_(a),
        folder_(std::move(folder)),
        size_(size),
        budget_(budget),
        progress_(progress_enabled(a)) {}

  static bool progress_enabled(const Args& a) {
    return !a.no_progress && !a.json && (a.progress || stderr_is_tty());
  }

  int run() {
    const bool do_write = a_.write || a_.both || (!a_.read);
    const bool do_read = a_.read || a_.both || (!a_.write);
    path_ = (std::filesystem::path(folder_) / kFileName).string();
    Result<PinnedBuffer> buffer = PinnedBuffer::allocate(static_cast<size_t>(size_));
    if (!buffer.is_ok())
      return fail(kCommand, "cannot allocate the buffer: " + buffer.status().to_string(),
                  kExitFailure);
    buffer_ = &*buffer;
    fill_pseudo_random(buffer_->data(), static_cast<size_t>(size_), 0x9e3779b97f4a7c15ULL);
    if (!a_.json) {
      std::cout << "fastpersist tune: " << folder_ << ", " << format_bytes(size_)
                << " per measurement, budget " << format_fixed(budget_, 0) << " s, "
                << (do_write && do_read ? "write and read"
                    : do_write          ? "write"
                                        : "read")
                << "\n";
      std::cout.flush();
    }
    const tune::Space space = engine_space();
    const tune::Candidate start = start_candidate();
    // Shares of the budget: the engine searches, then the staging size (writes only).
    const double engine_share = do_write && do_read ? 0.42 : 0.85;
    std::optional<Phase> write, read, staging;
    if (do_write) {
      auto r = run_phase("write", space, start, engine_share * budget_,
                         [this](const tune::Candidate& c) { return measure_write(c); });
      if (!r.is_ok()) return cleanup_fail(r.status());
      write = std::move(*r);
    }
    if (do_read) {
      Status prep = prepare_read();
      if (!prep.is_ok()) return cleanup_fail(prep);
      auto r = run_phase("read", space, start, engine_share * budget_,
                         [this](const tune::Candidate& c) { return measure_read(c); });
      if (!r.is_ok()) return cleanup_fail(r.status());
      read = std::move(*r);
    }
    tune::Candidate best = choose(write, read);
    if (do_write) {
      // Staging sizes up to a quarter of the stream: a larger one would measure pinning memory
      // that the stream never fills.
      tune::Space writer_space;
      for (size_t mib : {16, 32, 64, 128, 256}) {
        if ((uint64_t{mib} << 20) * 4 <= size_ || mib == 16)
          writer_space.writer_buffers.push_back(mib << 20);
      }
      writer_space.single_submit.clear();
      writer_space.overlap_events.clear();
      tune::Candidate from = best;
      from.writer_buffer =
          std::min(FastFileWriterOptions{}.io_buffer_bytes, writer_space.writer_buffers.back());
      auto r = run_phase("writer staging", writer_space, from, remaining(),
                         [this](const tune::Candidate& c) { return measure_writer(c); });
      if (!r.is_ok()) return cleanup_fail(r.status());
      staging = std::move(*r);
      best.writer_buffer = staging->outcome.ranked.front().candidate.writer_buffer;
    }
    (void)remove_file(path_);
    return report(best, write, read, staging);
  }

 private:
  double remaining() const {
    double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - began_).count();
    return std::max(1.0, budget_ - spent);
  }

  int cleanup_fail(const Status& st) {
    progress_.clear();
    (void)remove_file(path_);
    return fail(kCommand, st.to_string(), kExitFailure);
  }

  tune::Space engine_space() const {
    tune::Space s;
    for (const BackendProbe& p : probe_all_backends()) {
      if (p.available) s.backends.push_back(p.backend);
    }
    for (size_t kib : {128, 256, 512, 1024, 2048, 4096, 8192, 16384})
      s.block_sizes.push_back(kib << 10);
    s.queue_depths = {4, 8, 16, 32, 64, 128};
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    for (unsigned p = 1; p <= std::min(8u, std::max(2u, cores)); p *= 2) s.parallelism.push_back(p);
    return s;
  }

  // Where the search starts: the active configuration over io-bench's defaults, so a second
  // tune refines the first.
  tune::Candidate start_candidate() const {
    const EngineOptions base = io_bench::default_engine_options();
    Result<EngineOptions> o = engine_options_from_env(base);
    tune::Candidate c;
    c.engine = o.is_ok() ? *o : base;
    if (c.engine.backend == Backend::kAuto) {
      Result<Backend> b = resolve_backend(Backend::kAuto);
      if (b.is_ok()) c.engine.backend = *b;
    }
    return c;
  }

  Result<Phase> run_phase(const std::string& name, const tune::Space& space,
                          const tune::Candidate& start, double seconds,
                          const tune::Measure& measure) {
    tune::SearchOptions o;
    o.budget_seconds = seconds;
    double best = 0;
    auto on_progress = [&](size_t n, const tune::Candidate&, double rate, double spent) {
      best = std::max(best, rate);
      progress_.draw(tune::progress_line(name, n, rate, spent, best));
    };
    Result<tune::Outcome> r = tune::search(space, start, o, measure, on_progress);
    progress_.clear();
    if (!r.is_ok()) return r.status();
    if (!a_.json) print_phase(name, *r);
    return Phase{name, std::move(*r)};
  }

  Result<double> measure_write(const tune::Candidate& c) {
    FP_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> engine, IoEngine::create(c.engine));
    FP_RETURN_IF_ERROR(remove_file(path_));
    io_bench::Loop loop;
    FP_RETURN_IF_ERROR(io_bench::timed_write(*engine, path_, buffer_->data(), size_, &loop));
    return io_bench::gb_per_s(size_, loop.seconds);
  }

  Status prepare_read() {
    FP_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> engine,
                        IoEngine::create(start_candidate().engine));
    return io_bench::prepare_read_file(*engine, path_, buffer_->data(), size_, false);
  }

  Result<double> measure_read(const tune::Candidate& c) {
    FP_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> engine, IoEngine::create(c.engine));
    io_bench::Loop loop;
    FP_RETURN_IF_ERROR(io_bench::timed_read(*engine, path_, buffer_->data(), size_, &loop));
    return io_bench::gb_per_s(size_, loop.seconds);
  }

  // FastFileWriter with staging of c.writer_buffer, fed 256 KiB pieces; close() (fdatasync) timed.
  Result<double> measure_writer(const tune::Candidate& c) {
    FP_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> created, IoEngine::create(c.engine));
    std::shared_ptr<IoEngine> engine(std::move(created));
    FastFileWriterOptions wo;
    wo.io_buffer_bytes = c.writer_buffer;
    const std::string target = path_ + ".writer";
    auto start = std::chrono::steady_clock::now();
    FP_ASSIGN_OR_RETURN(std::unique_ptr<FastFileWriter> w,
                        FastFileWriter::open(target, wo, engine));
    for (uint64_t at = 0; at < size_; at += kWriterPiece) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kWriterPiece, size_ - at));
      FP_RETURN_IF_ERROR(w->write(buffer_->data() + at, n));
    }
    FP_RETURN_IF_ERROR(w->close());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    (void)remove_file(target);
    return io_bench::gb_per_s(size_, seconds);
  }

  // The engine settings to keep: the best of a single direction; with both, among the leaders
  // of either direction the one whose worse direction is closest to that direction's best
  // (measured in the direction it lacks, once, when time is left).
  tune::Candidate choose(const std::optional<Phase>& write, const std::optional<Phase>& read) {
    if (!write) return read->outcome.ranked.front().candidate;
    if (!read) return write->outcome.ranked.front().candidate;
    auto rate_in = [](const Phase& p, const tune::Candidate& c) -> std::optional<double> {
      for (const tune::Trial& t : p.outcome.ranked) {
        if (t.candidate == c) return t.median();
      }
      return std::nullopt;
    };
    std::vector<tune::Candidate> leaders;
    for (const Phase* p : {&*write, &*read}) {
      for (size_t i = 0; i < std::min<size_t>(3, p->outcome.ranked.size()); ++i) {
        const tune::Candidate& c = p->outcome.ranked[i].candidate;
        if (std::find(leaders.begin(), leaders.end(), c) == leaders.end()) leaders.push_back(c);
      }
    }
    const double wbest = write->outcome.ranked.front().median();
    const double rbest = read->outcome.ranked.front().median();
    tune::Candidate best = write->outcome.ranked.front().candidate;
    double best_score = -1;
    for (const tune::Candidate& c : leaders) {
      std::optional<double> w = rate_in(*write, c), r = rate_in(*read, c);
      if (!w && remaining() > 1) {
        Result<double> m = measure_write(c);
        if (m.is_ok()) w = *m;
      }
      if (!r && remaining() > 1) {
        Result<double> m = measure_read(c);
        if (m.is_ok()) r = *m;
      }
      if (!w || !r) continue;
      const double score = std::min(*w / wbest, *r / rbest);
      if (score > best_score) {
        best_score = score;
        best = c;
        chosen_write_ = *w;
        chosen_read_ = *r;
      }
    }
    return best;
  }

  void print_phase(const std::string& name, const tune::Outcome& out) {
    std::cout << name << ": " << out.measurements << " measurements of " << out.ranked.size()
              << " settings in " << format_fixed(out.seconds, 1) << " s"
              << (out.out_of_budget ? " (budget spent)" : "") << "\n";
    std::vector<std::vector<std::string>> rows = {
        {"RANK", "GB/S", "RUNS", "BACKEND", "BLOCK", "QD", "PAR", "SUBMIT", "EVENTS", "STAGING"}};
    for (size_t i = 0; i < std::min(kShownRows, out.ranked.size()); ++i) {
      const tune::Trial& t = out.ranked[i];
      const EngineOptions& e = t.candidate.engine;
      rows.push_back({std::to_string(i + 1), format_fixed(t.median(), 2),
                      std::to_string(t.rates.size()), std::string(backend_name(e.backend)),
                      format_bytes(e.block_size), std::to_string(e.queue_depth),
                      std::to_string(e.intra_op_parallelism), e.single_submit ? "single" : "batch",
                      e.overlap_events ? "overlap" : "lockstep",
                      t.candidate.writer_buffer ? format_bytes(t.candidate.writer_buffer) : "-"});
    }
    std::vector<size_t> widths(rows[0].size(), 0);
    for (const auto& r : rows) {
      for (size_t i = 0; i < r.size(); ++i) widths[i] = std::max(widths[i], r[i].size());
    }
    for (const auto& r : rows) {
      std::string line = " ";
      for (size_t i = 0; i < r.size(); ++i)
        line += " " + r[i] + std::string(widths[i] - r[i].size() + 1, ' ');
      while (line.back() == ' ') line.pop_back();
      std::cout << line << "\n";
    }
    std::cout.flush();
  }

  int report(const tune::Candidate& best, const std::optional<Phase>& write,
             const std::optional<Phase>& read, const std::optional<Phase>& staging) {
    nlohmann::ordered_json tuned;
    tuned["folder"] = folder_;
    tuned["size_bytes"] = size_;
    tuned["budget_seconds"] = budget_;
    tuned["created_unix"] =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    auto phase_json = [](const Phase& p) {
      nlohmann::ordered_json j;
      j["measurements"] = p.outcome.measurements;
      j["seconds"] = p.outcome.seconds;
      j["out_of_budget"] = p.outcome.out_of_budget;
      j["ranked"] = nlohmann::ordered_json::array();
      for (const tune::Trial& t : p.outcome.ranked) {
        nlohmann::ordered_json row = candidate_json(t.candidate);
        row["gb_per_s"] = t.median();
        row["runs"] = t.rates;
        j["ranked"].push_back(std::move(row));
      }
      return j;
    };
    double write_rate = chosen_write_, read_rate = chosen_read_;
    if (write && write_rate == 0) write_rate = write->outcome.ranked.front().median();
    if (read && read_rate == 0) read_rate = read->outcome.ranked.front().median();
    if (write) tuned["write_gb_per_s"] = write_rate;
    if (read) tuned["read_gb_per_s"] = read_rate;
    if (staging) tuned["writer_gb_per_s"] = staging->outcome.ranked.front().median();
    const std::optional<size_t> writer =
        best.writer_buffer ? std::optional<size_t>(best.writer_buffer) : std::nullopt;
    const std::string config = encode_config(best.engine, writer, tuned.dump());
    if (!a_.output.empty()) {
      Status st = write_config_file(a_.output, config);
      if (!st.is_ok())
        return fail(kCommand, "cannot write " + a_.output + ": " + st.to_string(), kExitFailure);
    }
    nlohmann::ordered_json phases;
    for (const std::optional<Phase>* p : {&write, &read, &staging}) {
      if (*p) phases[(*p)->name] = phase_json(**p);
    }
    if (a_.json) {
      nlohmann::ordered_json j;
      j["best"] = candidate_json(best);
      j["config"] = nlohmann::ordered_json::parse(config);
      j["deepspeed"] = deepspeed_aio(best.engine);
      j["phases"] = phases;
      if (!a_.output.empty()) j["output"] = a_.output;
      std::cout << json_text(j) << "\n";
      return plot(best, phases);
    }
    std::cout << "best: " << describe(best, true) << "\n  ";
    if (write) std::cout << "write " << format_fixed(write_rate, 2) << " GB/s";
    if (write && read) std::cout << ", ";
    if (read) std::cout << "read " << format_fixed(read_rate, 2) << " GB/s";
    if (staging)
      std::cout << ", FastFileWriter " << format_fixed(staging->outcome.ranked.front().median(), 2)
                << " GB/s";
    std::cout << "\n";
    if (!a_.output.empty()) {
      std::cout << "wrote " << a_.output << ": use it with FASTPERSIST_CONFIG=" << a_.output
                << ", `fastpersist --config " << a_.output << " ...` or fastpersist.load_config(\""
                << a_.output << "\")\n";
    }
    std::cout << "DeepSpeed config (the same settings for its aio_handle):\n"
              << deepspeed_aio(best.engine).dump(2) << "\n";
    std::cout.flush();
    return plot(best, phases);
  }

  // --plot: hands the measurements to Python (fastpersist.tune_plot), which draws the PNG.
  int plot(const tune::Candidate& best, const nlohmann::ordered_json& phases) const {
    if (a_.plot.empty()) return kExitOk;
    nlohmann::ordered_json data;
    data["folder"] = folder_;
    data["best"] = candidate_json(best);
    data["phases"] = phases;
    static constexpr const char* kBootstrap =
        "import sys\n"
        "try:\n"
        "    from fastpersist.tune_plot import main\n"
        "except ImportError as e:\n"
        "    sys.stderr.write('fastpersist tune --plot: error: the Python at %s cannot import '\n"
        "                     'fastpersist.tune_plot (%s); set FASTPERSIST_PYTHON to one that "
        "can\\n'\n"
        "                     % (sys.executable, e))\n"
        "    sys.exit(1)\n"
        "sys.exit(main(sys.argv[1:]))\n";
    std::cout.flush();
    return exec_python("tune --plot", kBootstrap, {data.dump(), a_.plot},
                       "fastpersist and matplotlib");
  }

  const Args& a_;
  std::string folder_;
  uint64_t size_;
  double budget_;
  StatusLine progress_;  // the search's line on stderr, blanked after each phase
  std::string path_;
  PinnedBuffer* buffer_ = nullptr;
  std::chrono::steady_clock::time_point began_ = std::chrono::steady_clock::now();
  double chosen_write_ = 0;
  double chosen_read_ = 0;
};

int run(const Args& a) {
  std::error_code ec;
  if (!std::filesystem::is_directory(a.folder, ec)) {
    return fail(
        kCommand,
        "--folder '" + a.folder + "': " +
            (std::filesystem::exists(a.folder, ec) ? "not a directory" : "no such directory"),
        kExitUsage);
  }
  Result<uint64_t> size = parse_size(a.size);
  if (!size.is_ok())
    return fail(kCommand, "invalid --size: " + size.status().message(), kExitUsage);
  if (*size < (uint64_t{1} << 20) || *size % 4096 != 0 || *size > (uint64_t{1} << 40)) {
    return fail(kCommand,
                "invalid --size '" + a.size + "': a multiple of 4 KiB from 1 MiB to 1 TiB",
                kExitUsage);
  }
  Result<double> budget = parse_duration(a.budget);
  if (!budget.is_ok()) return fail(kCommand, budget.status().message(), kExitUsage);
  // Where the results go is checked before minutes of measuring, not after.
  for (const auto& [flag, path] : {std::pair<const char*, const std::string&>{"--output", a.output},
                                   std::pair<const char*, const std::string&>{"--plot", a.plot}}) {
    if (path.empty()) continue;
    std::filesystem::path parent = std::filesystem::absolute(path, ec).parent_path();
    if (!std::filesystem::is_directory(parent, ec) || ::access(parent.c_str(), W_OK) != 0) {
      return fail(kCommand,
                  std::string(flag) + " '" + path + "': " + parent.string() +
                      " is not a folder this process can write to",
                  kExitUsage);
    }
    if (std::filesystem::is_directory(path, ec)) {
      return fail(kCommand, std::string(flag) + " '" + path + "' is a folder, not a file name",
                  kExitUsage);
    }
  }
  if (Result<EngineOptions> env = engine_options_from_env(); !env.is_ok()) {
    return fail(kCommand, env.status().message(), kExitUsage);
  }
  const std::string folder = std::filesystem::absolute(a.folder, ec).lexically_normal().string();
  Tuner t(a, folder, *size, *budget);
  return t.run();
}

}  // namespace

Command add_tune_command(CLI::App& parent) {
  auto args = std::make_shared<Args>();
  CLI::App* app = parent.add_subcommand("tune",
                                        "Find the fastest I/O settings for a folder's storage "
                                        "(within a time budget) and write them as a "
                                        "configuration file");
  app->add_option("--folder", args->folder, "A folder on the storage to tune for")->required();
  app->add_option("--size", args->size, "Bytes per measurement (default 1GiB)");
  app->add_option("--budget", args->budget, "Time to spend, e.g. 120s, 5m (default 120s)");
  auto* w = app->add_flag("--write", args->write, "Tune writes only");
  auto* r = app->add_flag("--read", args->read, "Tune reads only");
  auto* b = app->add_flag("--both", args->both, "Tune writes and reads (the default)");
  w->excludes(r)->excludes(b);
  r->excludes(b);
  app->add_option("--output", args->output,
                  "Write the best settings to this configuration file (JSON)");
  app->add_option("--plot", args->plot,
                  "Draw GB/s against block size and queue depth, per backend, into this PNG "
                  "(runs Python; needs matplotlib there)");
  app->add_flag("--json", args->json, "Print one JSON object instead of text");
  auto* p = app->add_flag("--progress", args->progress,
                          "Draw a progress line on stderr (default: when a terminal)");
  app->add_flag("--no-progress", args->no_progress, "Never draw the progress line")->excludes(p);
  return {app, [args] { return run(*args); }};
}

}  // namespace fastpersist::cli
