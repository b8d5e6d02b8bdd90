// SPDX-License-Identifier: Apache-2.0
// `fastpersist clean DIR... [-r] [--dry-run] [--parallel-min-age S] [--json]`: removes the
// temporaries that FastFileWriters (fastpersist.save, torch.save into a FastFileWriter) left when
// their process died (".<name>.fp-tmp-XXXXXX"), and parallel writers' sets that no writer holds
// and nobody wrote for S seconds (".<name>.fp-partial" + records). A temporary whose writer is
// alive is locked and is only listed, so the command is safe to run while jobs are saving into
// the same folders. See src/stream/stale_files.h.
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint_paths.h"
#include "command.h"
#include "format.h"
#include "number_checks.h"
#include "stream/stale_files.h"

namespace fastpersist::cli {
namespace {

constexpr const char* kCommand = "clean";

struct Args {
  std::vector<std::string> dirs;
  bool dry_run = StaleFileOptions{}.dry_run;
  bool json = false;
  double parallel_min_age = StaleFileOptions{}.parallel_set_min_age_seconds;
  bool recursive = StaleFileOptions{}.recursive;
};

void print_text(const std::string& dir, const StaleFileReport& r, bool dry_run) {
  for (const std::string& p : r.removed)
    std::cout << (dry_run ? "would remove " : "removed ") << p << "\n";
  for (const std::string& p : r.in_use)
    std::cout << "in use (a writer is alive), kept " << p << "\n";
  for (const std::string& p : r.too_recent) {
    std::cout << "no writer left, but written recently (a rank may still come), kept " << p << "\n";
  }
  for (const auto& [p, why] : r.failed) std::cout << "cannot remove " << p << ": " << why << "\n";
  std::cout << dir << ": ";
  if (r.removed.empty()) {
    std::cout << "no temporaries of dead writers";
  } else {
    std::cout << (dry_run ? "would remove " : "removed ") << r.removed.size()
              << (r.removed.size() == 1 ? " temporary" : " temporaries") << " of dead writers ("
              << format_bytes(r.removed_bytes) << ")";
  }
  if (!r.in_use.empty()) std::cout << ", " << r.in_use.size() << " in use";
  std::cout << "\n";
}

nlohmann::ordered_json to_json(const std::string& dir, const StaleFileReport& r) {
  nlohmann::ordered_json failed = nlohmann::ordered_json::array();
  for (const auto& [p, why] : r.failed) failed.push_back({{"path", p}, {"error", why}});
  return {{"dir", dir},         {"removed", r.removed},       {"removed_bytes", r.removed_bytes},
          {"in_use", r.in_use}, {"too_recent", r.too_recent}, {"failed", failed}};
}

int run(const Args& a) {
  nlohmann::ordered_json all = nlohmann::ordered_json::array();
  int code = kExitOk;
  for (const std::string& dir : a.dirs) {
    PathInfo p = classify_path(dir);
    if (p.kind == PathKind::kMissing) return fail(kCommand, p.error, kExitUsage);
    if (p.kind == PathKind::kOtherFile || p.kind == PathKind::kSafetensors ||
        p.kind == PathKind::kTorchFile) {
      return fail(kCommand, dir + " is a file; give the directory that holds it", kExitUsage);
    }
  }
  for (const std::string& dir : a.dirs) {
    StaleFileOptions o;
    o.dry_run = a.dry_run;
    o.parallel_set_min_age_seconds = a.parallel_min_age;
    o.recursive = a.recursive;
    auto report = remove_stale_temp_files(dir, o);
    if (!report.is_ok()) return fail(kCommand, report.status().to_string(), kExitFailure);
    if (!report->failed.empty()) code = kExitFailure;
    if (a.json) {
      all.push_back(to_json(dir, *report));
    } else {
      print_text(dir, *report, a.dry_run);
    }
  }
  if (a.json) {
    std::cout << json_text(nlohmann::ordered_json{{"dry_run", a.dry_run}, {"dirs", all}}) << "\n";
  } else if (a.dry_run) {
    std::cout << "nothing was changed (dry run)\n";
  }
  std::cout.flush();
  return code;
}

}  // namespace

Command add_clean_command(CLI::App& parent) {
  auto args = std::make_shared<Args>();
  CLI::App* app =
      parent.add_subcommand("clean",
                            "Remove the temporary files of writers that died before they committed "
                            "(.NAME.fp-tmp-*); files of living writers are kept");
  app->add_option("DIR", args->dirs, "Folders to clean")->required();
  app->add_flag(
      "-r,--recursive", args->recursive,
      "Also every folder below DIR (symlinks not followed, other filesystems not entered)");
  app->add_flag("--dry-run", args->dry_run, "Only print what would be removed");
  app->add_option("--parallel-min-age", args->parallel_min_age,
                  "Remove a parallel writers' set (.NAME.fp-partial) that no writer holds only "
                  "when it was last written at least this many seconds ago")
      ->check(finite_in(0.0, 1e12))
      ->capture_default_str();
  app->add_flag("--json", args->json, "Print one JSON object instead of text");
  return {app, [args] { return run(*args); }};
}

}  // namespace fastpersist::cli
