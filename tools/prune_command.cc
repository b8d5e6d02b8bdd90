// SPDX-License-Identifier: Apache-2.0
// `fastpersist prune ROOT --keep-last N [--keep-every K]`: applies a retention policy to a
// root now, through a CheckpointManager, so it takes the root's lock (a training job that is
// writing there makes it fail cleanly instead of racing it) and removes each checkpoint the
// safe way (renamed aside first). The newest checkpoint is always kept. --dry-run only lists.
// The dry run says why each kept checkpoint stays: one of the newest N, a milestone, or the base
// that a kept incremental checkpoint references (retention never removes that one).
// --verify reads the checkpoints it would keep: bit rot in the newest ones does not make it
// delete the last intact one.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "checkpoint_paths.h"
#include "command.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/maintenance.h"
#include "fastpersist/object_store.h"
#include "fastpersist/options.h"
#include "format.h"
#include "number_checks.h"

namespace fastpersist::cli {
namespace {

constexpr const char* kCommand = "prune";

struct Args {
  std::string root;
  unsigned keep_last = 0;
  std::optional<int64_t> keep_every;
  bool dry_run = false;
  bool json = false;
  bool verify = false;
};

std::string lock_message(const Status& st) {
  return st.code() == StatusCode::kBusy ? st.message() : st.to_string();
}

// Whether another manager holds <root>/.lock, found without creating or writing anything
// (a real lock attempt records its pid in the file). Empty when free; else a sentence.
std::string lock_holder(const std::string& root) {
  std::string path = root + "/.lock";
  // Never through a planted symbolic link, never blocking on a FIFO.
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return "";  // never locked (or not a lock a manager made: opening the root says so)
  std::string holder;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char buf[32] = {};
    ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
    std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    holder = "checkpoint root " + root + " is in use by another CheckpointManager" +
             (pid.empty() ? "" : " (pid " + pid + ")");
  }
  ::close(fd);  // drops the lock if we got it
  return holder;
}

// `why`: for a dry run, why each kept checkpoint stays (retention.h's reasons), in kept order.
int report(const Args& a, const std::vector<std::string>& removed,
           const std::vector<std::string>& kept, const std::vector<std::string>& damaged,
           const std::string& note,
           const std::vector<std::pair<std::string, std::string>>& why = {}) {
  if (a.json) {
    nlohmann::ordered_json j = {
        {"root", a.root}, {"dry_run", a.dry_run}, {"removed", removed}, {"kept", kept}};
    if (!why.empty()) {
      nlohmann::ordered_json reasons = nlohmann::ordered_json::object();
      for (const auto& [tag, reason] : why) reasons[tag] = reason;
      j["kept_because"] = reasons;
    }
    if (a.verify) j["damaged"] = damaged;
    if (!note.empty()) j["note"] = note;
    std::cout << json_text(j) << "\n";
    std::cout.flush();
    return kExitOk;
  }
  for (const std::string& d : damaged) {
    std::cout << "damaged (fails verification, does not count towards --keep-last): " << d << "\n";
  }
  const char* verb = a.dry_run ? "would remove " : "removed ";
  for (const std::string& tag : removed) std::cout << verb << tag << "\n";
  for (const auto& [tag, reason] : why) std::cout << "keep " << tag << ": " << reason << "\n";
  std::string kept_text;
  for (const std::string& tag : kept) kept_text += (kept_text.empty() ? "" : ", ") + tag;
  if (removed.empty()) {
    std::cout << "nothing to remove: " << kept.size()
              << (kept.size() == 1 ? " checkpoint" : " checkpoints") << " kept";
  } else {
    std::cout << (a.dry_run ? "dry run: would remove " : "removed ") << removed.size() << ", "
              << (a.dry_run ? "keep " : "kept ") << kept.size();
  }
  std::cout << (kept_text.empty() ? "" : " (" + kept_text + ")") << "\n";
  if (a.dry_run) std::cout << "nothing was changed (dry run)\n";
  if (!note.empty()) std::cout << "note: " << note << "\n";
  std::cout.flush();
  return kExitOk;
}

// The engine that --verify reads with (null without it).
Result<std::unique_ptr<IoEngine>> verify_engine(const Args& a, const EngineOptions& options) {
  if (!a.verify) return std::unique_ptr<IoEngine>();
  return IoEngine::create(options);
}

int run(const Args& a) {
  auto options = engine_options_from_env();
  if (!options.is_ok()) return fail(kCommand, options.status().to_string(), kExitUsage);
  const RetentionPolicy policy{a.keep_last, a.keep_every};
  if (is_object_store_url(a.root)) {
    // No lock to take (one drainer per tier, docs/tiers.md); every removal deletes the manifest
    // first.
    auto objects = ObjectStoreRoot::open(a.root);
    if (!objects.is_ok()) return fail(kCommand, objects.status().to_string(), kExitFailure);
    auto engine = verify_engine(a, *options);
    if (!engine.is_ok()) return fail(kCommand, engine.status().to_string(), kExitFailure);
    auto plan = (*objects)->prune(policy, a.dry_run, engine->get());
    if (!plan.is_ok()) return fail(kCommand, plan.status().to_string(), kExitFailure);
    return report(a, plan->remove, plan->kept, plan->damaged, "",
                  a.dry_run ? plan->kept_because : decltype(plan->kept_because){});
  }
  PathInfo p = classify_path(a.root);
  if (p.kind == PathKind::kMissing) return fail(kCommand, p.error, kExitUsage);
  if (p.kind == PathKind::kCheckpoint || p.kind == PathKind::kIncompleteCheckpoint) {
    return fail(kCommand, wrong_kind(p, "a root: prune the directory that holds it"), kExitUsage);
  }
  if (p.kind != PathKind::kRoot) {
    return fail(kCommand, a.root + " is a file, not a checkpoint root (a directory)", kExitUsage);
  }
  if (a.dry_run) {
    // Changes nothing: no debris cleanup, no lock kept. Says whether a real prune could lock.
    std::string note = lock_holder(a.root);
    if (!note.empty()) note = "a real prune would fail now: " + note;
    auto engine = verify_engine(a, *options);
    if (!engine.is_ok()) return fail(kCommand, engine.status().to_string(), kExitFailure);
    auto plan = plan_prune(a.root, policy, engine->get());
    if (!plan.is_ok()) return fail(kCommand, plan.status().to_string(), kExitFailure);
    // A checkpoint --verify demoted is kept (while it is the newest) but not among the reasons.
    return report(a, plan->remove, plan->kept, plan->damaged, note, plan->kept_because);
  }
  const std::optional<unsigned> keep_last = a.keep_last;

  CheckpointOptions copts;
  copts.engine = *options;
  auto manager = CheckpointManager::open(a.root, copts);
  if (!manager.is_ok()) return fail(kCommand, lock_message(manager.status()), kExitFailure);
  std::vector<std::string> damaged;
  auto removed = (*manager)->prune(keep_last, a.keep_every, a.verify, &damaged);
  auto remaining = (*manager)->list();
  Status closed = (*manager)->close();
  if (!removed.is_ok()) return fail(kCommand, removed.status().to_string(), kExitFailure);
  if (!closed.is_ok()) return fail(kCommand, closed.to_string(), kExitFailure);
  std::vector<std::string> kept;
  if (remaining.is_ok()) {
    for (const CheckpointInfo& c : *remaining) kept.push_back(c.tag);
  }
  return report(a, *removed, kept, damaged, "");
}

}  // namespace

Command add_prune_command(CLI::App& parent) {
  auto args = std::make_shared<Args>();
  CLI::App* app = parent.add_subcommand(
      "prune",
      "Remove old checkpoints of a root (keeps the newest N, and milestones with --keep-every); "
      "takes the root's lock");
  app->add_option("ROOT", args->root, "Checkpoint root")->required();
  app->add_option("--keep-last", args->keep_last, "Keep the newest N checkpoints (N >= 1)")
      ->required()
      ->check(integer_in(1, int64_t{1} << 30));
  app->add_option("--keep-every", args->keep_every,
                  "Also keep every checkpoint whose step is a multiple of K")
      ->check(integer_in(1, INT64_MAX));
  app->add_flag("--dry-run", args->dry_run, "Only print what would be removed");
  app->add_flag("--verify", args->verify,
                "Check the checksums of the checkpoints that would be kept (newest first); one "
                "that fails does not count towards --keep-last, so an older intact one stays");
  app->add_flag("--json", args->json, "Print one JSON object instead of text");
  return {app, [args] { return run(*args); }};
}

}  // namespace fastpersist::cli
