// SPDX-License-Identifier: Apache-2.0
// `fastpersist advise --mtbf-hours M (--checkpoint-seconds C | --measure ROOT) [--step-seconds S]
// [--restart-seconds R] [--json]`: the checkpoint interval that minimizes the expected lost work
// plus the checkpoint overhead (Young, Daly: save_policy.h), in seconds and in steps, and the
// overhead and expected loss it implies. --measure takes C from the blocking time that a
// manager records in each manifest (the median of the newest ten that have it).
#include <algorithm>
#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint_paths.h"
#include "command.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/save_policy.h"
#include "format.h"
#include "number_checks.h"

namespace fastpersist::cli {
namespace {

constexpr const char* kCommand = "advise";
constexpr size_t kMeasured = 10;

struct Args {
  std::optional<double> checkpoint_seconds;
  std::string measure;
  double mtbf_hours = 0;
  std::optional<double> step_seconds;
  double restart_seconds = 0;
  bool json = false;
};

std::string seconds_text(double s) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(s < 10 ? 2 : 0) << s << " s";
  if (s >= 7200) {
    out << " (" << std::setprecision(1) << s / 3600 << " h)";
  } else if (s >= 120) {
    out << " (" << std::setprecision(1) << s / 60 << " min)";
  }
  return out.str();
}

std::string percent(double f) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(2) << 100 * f << "%";
  return out.str();
}

// The median blocking time of the newest checkpoints of `root` that record one.
Result<std::pair<double, size_t>> measured_blocking(const std::string& root) {
  FP_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, list_checkpoints(root));
  std::vector<double> times;
  for (auto it = all.rbegin(); it != all.rend() && times.size() < kMeasured; ++it) {
    auto m = read_manifest(root + "/" + it->tag);
    if (m.is_ok() && m->blocking_seconds) times.push_back(*m->blocking_seconds);
  }
  if (times.empty()) {
    return Status(StatusCode::kNotFound,
                  "no checkpoint under " + root +
                      " records its blocking time (none saved by a manager that records it): "
                      "pass --checkpoint-seconds");
  }
  std::sort(times.begin(), times.end());
  size_t n = times.size();
  double median = n % 2 ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
  return std::make_pair(median, n);
}

int run(const Args& a) {
  if (a.checkpoint_seconds.has_value() == !a.measure.empty()) {
    return fail(kCommand, "give exactly one of --checkpoint-seconds and --measure", kExitUsage);
  }
  double c = a.checkpoint_seconds.value_or(0);
  size_t measured = 0;
  if (!a.measure.empty()) {
    PathInfo p = classify_path(a.measure);
    if (p.kind != PathKind::kRoot)
      return fail(kCommand, wrong_kind(p, "a checkpoint root"), kExitUsage);
    auto m = measured_blocking(a.measure);
    if (!m.is_ok()) return fail(kCommand, m.status().message(), kExitFailure);
    c = m->first;
    measured = m->second;
    if (c <= 0) c = 1e-6;  // a save that blocked for no measurable time
  }
  auto advice = advise_interval(c, a.mtbf_hours * 3600, a.step_seconds, a.restart_seconds);
  if (!advice.is_ok()) return fail(kCommand, advice.status().message(), kExitUsage);
  const IntervalAdvice& r = *advice;
  if (a.json) {
    nlohmann::ordered_json j = {
        {"checkpoint_seconds", c},
        {"measured_checkpoints", measured},
        {"mtbf_seconds", a.mtbf_hours * 3600},
        {"young_seconds", r.young_seconds},
        {"interval_seconds", r.interval_seconds},
        {"interval_steps", r.interval_steps ? nlohmann::ordered_json(*r.interval_steps)
                                            : nlohmann::ordered_json(nullptr)},
        {"checkpoint_overhead", r.checkpoint_overhead},
        {"expected_loss", r.expected_loss},
        {"total_waste", r.total_waste}};
    std::cout << json_text(j) << "\n";
    return kExitOk;
  }
  std::cout << "checkpoint cost: " << seconds_text(c)
            << (measured
                    ? " (median blocking time of the newest " + std::to_string(measured) + " saves)"
                    : "")
            << "\nmean time between failures: " << seconds_text(a.mtbf_hours * 3600) << "\n";
  std::cout << "save every " << seconds_text(r.interval_seconds)
            << " of training (Daly; Young: " << seconds_text(r.young_seconds) << ")\n";
  if (r.interval_steps) std::cout << "  = every " << *r.interval_steps << " steps\n";
  std::cout << "checkpoint overhead: " << percent(r.checkpoint_overhead)
            << ", expected loss to failures: " << percent(r.expected_loss)
            << ", total: " << percent(r.total_waste) << " of the run\n";
  std::cout.flush();
  return kExitOk;
}

}  // namespace

Command add_advise_command(CLI::App& parent) {
  auto args = std::make_shared<Args>();
  CLI::App* app = parent.add_subcommand("advise",
                                        "Print the checkpoint interval that minimizes lost work "
                                        "plus checkpoint overhead (Young/Daly)");
  app->add_option("--checkpoint-seconds", args->checkpoint_seconds,
                  "What one checkpoint costs the training loop (seconds it blocks)")
      ->check(finite_in(1e-9, 1e9));
  app->add_option(
      "--measure", args->measure,
      "Take the checkpoint cost from the blocking times recorded in this root's manifests");
  app->add_option("--mtbf-hours", args->mtbf_hours, "Mean time between failures of the job, hours")
      ->required()
      ->check(finite_in(1e-6, 1e9));
  app->add_option("--step-seconds", args->step_seconds,
                  "Seconds per training step: also give the interval in steps")
      ->check(finite_in(1e-9, 1e9));
  app->add_option("--restart-seconds", args->restart_seconds, "What a restart costs (seconds) [0]")
      ->check(finite_in(0, 1e9));
  app->add_flag("--json", args->json, "Print one JSON object instead of text");
  return {app, [args] { return run(*args); }};
}

}  // namespace fastpersist::cli
