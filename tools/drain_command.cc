// SPDX-License-Identifier: Apache-2.0
// `fastpersist drain ROOT TIER [--keep-last N] [--keep-every K] [--every N] [--bandwidth SIZE]`:
// one pass of what a CheckpointManager with a tier does in the background (docs/tiers.md):
// every committed checkpoint of ROOT that the tier's policy selects and the tier lacks is
// copied there, verified on the way, and committed there with the manifest last; then the
// tier's retention runs. Reads ROOT without its lock (a running job may keep saving there);
// takes TIER's lock while it copies. --dry-run prints the plan and changes nothing.
#include <chrono>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint_paths.h"
#include "command.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/maintenance.h"
#include "fastpersist/options.h"
#include "format.h"
#include "number_checks.h"

namespace fastpersist::cli {
namespace {

constexpr const char* kCommand = "drain";

struct Args {
  std::string root;
  std::string tier;
  std::optional<unsigned> keep_last;
  std::optional<int64_t> keep_every;
  std::optional<int64_t> every;
  std::string bandwidth;
  std::string part_size;
  std::optional<unsigned> transfers;
  bool dry_run = false;
  bool json = false;
};

int report(const Args& a, const std::vector<std::string>& plan, const DrainReport& pass) {
  std::vector<std::string> failures;
  for (const Status& st : pass.failures) failures.push_back(st.to_string());
  if (a.json) {
    nlohmann::ordered_json j = {
        {"root", a.root},       {"tier", a.tier},          {"dry_run", a.dry_run},
        {"planned", plan},      {"drained", pass.drained}, {"gone", pass.gone},
        {"failures", failures}, {"bytes", pass.bytes},     {"seconds", pass.seconds}};
    std::cout << json_text(j) << "\n";
  } else if (a.dry_run) {
    for (const std::string& tag : plan) std::cout << "would drain " << tag << "\n";
    std::cout << (plan.empty() ? "nothing to drain" : std::to_string(plan.size()) + " to drain")
              << " into " << a.tier << "\nnothing was changed (dry run)\n";
  } else {
    for (const std::string& tag : pass.drained) std::cout << "drained " << tag << "\n";
    for (const std::string& tag : pass.gone)
      std::cout << "skipped " << tag << ": removed from " << a.root << " meanwhile\n";
    for (const std::string& f : failures) std::cerr << "fastpersist drain: error: " << f << "\n";
    double rate = pass.seconds > 0 ? static_cast<double>(pass.bytes) / pass.seconds : 0;
    std::cout << pass.drained.size() << " drained into " << a.tier << " ("
              << format_bytes(pass.bytes);
    if (rate > 0) std::cout << ", " << format_bytes(static_cast<uint64_t>(rate)) << "/s";
    std::cout << ")" << (failures.empty() ? "" : ", " + std::to_string(failures.size()) + " failed")
              << "\n";
  }
  std::cout.flush();
  return failures.empty() ? kExitOk : kExitFailure;
}

int run(const Args& a) {
  PathInfo p = classify_path(a.root);
  if (p.kind != PathKind::kRoot)
    return fail(kCommand, wrong_kind(p, "a checkpoint root"), kExitUsage);
  TierOptions tier;
  tier.path = a.tier;
  tier.keep_last = a.keep_last;
  tier.keep_every = a.keep_every;
  tier.every = a.every;
  if (!a.bandwidth.empty()) {
    auto cap = parse_size(a.bandwidth);
    if (!cap.is_ok())
      return fail(kCommand, "invalid --bandwidth: " + cap.status().message(), kExitUsage);
    tier.bandwidth_bytes_per_second = *cap;
  }
  if (!tier.is_object_store() && (!a.part_size.empty() || a.transfers)) {
    return fail(kCommand, "--part-size and --transfers are for object-store tiers (s3://...)",
                kExitUsage);
  }
  if (!a.part_size.empty()) {
    auto part = parse_size(a.part_size);
    if (!part.is_ok())
      return fail(kCommand, "invalid --part-size: " + part.status().message(), kExitUsage);
    tier.part_bytes = *part;
  }
  if (a.transfers) tier.transfers = *a.transfers;
  auto engine_options = engine_options_from_env();
  if (!engine_options.is_ok())
    return fail(kCommand, engine_options.status().to_string(), kExitUsage);
  if (Status st = validate_tiers(a.root, {tier}); !st.is_ok()) {
    return fail(kCommand, st.message(), kExitUsage);
  }
  // kBusy: another drainer holds the tier; its message names the holder.
  auto failed = [](const Status& st) {
    return fail(kCommand, st.code() == StatusCode::kBusy ? st.message() : st.to_string(),
                kExitFailure);
  };
  if (a.dry_run) {
    if (!tier.is_object_store()) {
      PathInfo t = classify_path(a.tier);
      if (t.kind != PathKind::kRoot && t.kind != PathKind::kMissing) {
        return fail(kCommand, wrong_kind(t, "a checkpoint root (or a path to create one at)"),
                    kExitUsage);
      }
    }
    auto plan = plan_drain_into(a.root, tier);
    if (!plan.is_ok()) return failed(plan.status());
    return report(a, *plan, {});
  }
  std::function<void(const std::string&)> on_begin;
  if (!a.json) {
    on_begin = [](const std::string& tag) { std::cerr << "draining " << tag << " ...\n"; };
  }
  auto pass = drain_into(a.root, tier, *engine_options, on_begin);
  if (!pass.is_ok()) return failed(pass.status());
  return report(a, pass->planned, *pass);
}

}  // namespace

Command add_drain_command(CLI::App& parent) {
  auto args = std::make_shared<Args>();
  CLI::App* app = parent.add_subcommand(
      "drain",
      "Copy the committed checkpoints of a root into a tier (another root, e.g. on another "
      "filesystem) that lacks them, verified on the way; then apply the tier's retention");
  app->add_option("ROOT", args->root, "Checkpoint root to copy from")->required();
  app->add_option("TIER", args->tier,
                  "The tier: a checkpoint root (created if needed), or an object store's URL "
                  "(s3://bucket/prefix)")
      ->required();
  app->add_option("--keep-last", args->keep_last, "The tier keeps its newest N checkpoints")
      ->check(integer_in(1, int64_t{1} << 30));
  app->add_option("--keep-every", args->keep_every,
                  "The tier also keeps every checkpoint whose step is a multiple of K")
      ->check(integer_in(1, INT64_MAX));
  app->add_option("--every", args->every, "Copy only checkpoints whose step is a multiple of N")
      ->check(integer_in(1, INT64_MAX));
  app->add_option("--bandwidth", args->bandwidth,
                  "Cap the copy at this many bytes per second (e.g. 200MiB)");
  app->add_option("--part-size", args->part_size,
                  "Object stores: each uploaded part (5MiB to 5GiB; default 32MiB)");
  app->add_option("--transfers", args->transfers,
                  "Object stores: parts in flight at once (1 to 64; default 8)")
      ->check(integer_in(1, 64));
  app->add_flag("--dry-run", args->dry_run, "Only print what would be copied");
  app->add_flag("--json", args->json, "Print one JSON object instead of text");
  return {app, [args] { return run(*args); }};
}

}  // namespace fastpersist::cli
