// SPDX-License-Identifier: Apache-2.0
// `fastpersist verify PATH`: checks every byte of a checkpoint directory (or of every
// checkpoint under a root) against the checksums in its manifest, and prints every problem,
// naming the file and the tensor. A .safetensors file carries no checksums: only its header is
// validated, and the output says so.
//
// Exit codes: 0 intact; 1 damage found (or a checkpoint could not be read, or a root holds no
// checkpoint to vouch for); 2 bad arguments (a path that does not exist or is not one of those).
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "checkpoint_paths.h"
#include "command.h"
#include "common/progress.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/foreign_checkpoint.h"
#include "fastpersist/io_engine.h"
#include "fastpersist/maintenance.h"
#include "fastpersist/object_store.h"
#include "fastpersist/options.h"
#include "fastpersist/safetensors.h"
#include "format.h"

namespace fastpersist::cli {
namespace {

constexpr const char* kCommand = "verify";

struct Args {
  std::string path;
  bool json = false;
  bool progress = false;
  bool no_progress = false;
};

struct Outcome {
  std::string tag;
  std::string path;
  std::vector<std::string> problems;
  uint64_t bytes_checked = 0;
  double seconds = 0;
  bool has_checksums = true;
  bool ok() const { return problems.empty(); }
};

std::string base_name(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

void fill_outcome(Outcome& o, const Result<VerifyReport>& report) {
  if (!report.is_ok()) {
    o.problems.push_back("cannot be verified: " + report.status().to_string());
    return;
  }
  o.problems = report->problems;
  o.bytes_checked = report->bytes_checked;
  o.has_checksums = report->has_checksums;
}

Outcome verify_dir(const std::string& dir, const std::string& tag, IoEngine& engine,
                   bool progress) {
  Outcome o;
  o.tag = tag;
  o.path = dir;
  ProgressBar bar("verify " + tag, progress);
  auto start = std::chrono::steady_clock::now();
  auto report = verify_checkpoint(
      dir, engine, [&bar](uint64_t done, uint64_t total) { bar.update(done, total); });
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  bar.finish(/*clear=*/!report.is_ok() || !report->ok());
  fill_outcome(o, report);
  return o;
}

std::string speed(const Outcome& o) {
  if (!o.has_checksums) {
    return "saved without checksums: only sizes, headers and compressed frames were checked";
  }
  std::string text =
      format_bytes(o.bytes_checked) + " checked in " + format_fixed(o.seconds, 2) + " s";
  if (o.seconds > 0 && o.bytes_checked > 0) {
    text += " (" + format_bytes_short(static_cast<double>(o.bytes_checked) / o.seconds) + "/s)";
  }
  return text;
}

nlohmann::ordered_json outcome_json(const Outcome& o) {
  return {{"tag", o.tag},
          {"path", o.path},
          {"ok", o.ok()},
          {"problems", o.problems},
          {"bytes_checked", o.bytes_checked},
          {"checksums", o.has_checksums},
          {"seconds", o.seconds}};
}

Result<std::unique_ptr<IoEngine>> make_engine() {
  FP_ASSIGN_OR_RETURN(EngineOptions options, engine_options_from_env());
  return IoEngine::create(options);
}

int verify_checkpoint_dir(const Args& a, const std::string& dir, IoEngine& engine, bool progress) {
  Outcome o = verify_dir(dir, base_name(dir), engine, progress);
  if (a.json) {
    nlohmann::ordered_json j = {{"kind", "checkpoint"},
                                {"path", dir},
                                {"ok", o.ok()},
                                {"problems", o.problems},
                                {"checkpoints", {outcome_json(o)}}};
    std::cout << json_text(j) << "\n";
  } else if (o.ok()) {
    std::cout << "OK       " << dir << ": intact, " << speed(o) << "\n";
  } else {
    std::cout << "DAMAGED  " << dir << ": " << o.problems.size()
              << (o.problems.size() == 1 ? " problem" : " problems") << "\n";
    for (const std::string& p : o.problems) std::cout << "  - " << p << "\n";
  }
  std::cout.flush();
  return o.ok() ? kExitOk : kExitFailure;
}

int verify_tags(const Args& a, const std::string& root, const std::vector<std::string>& tags,
                const std::function<Outcome(const std::string&)>& check,
                const std::function<bool(const std::string&)>& vanished);

std::string unverifiable_note(const ForeignTag& f) {
  return "a DeepSpeed tag without a fastpersist manifest (" + std::to_string(f.files) +
         (f.files == 1 ? " file, " : " files, ") + format_bytes(f.bytes) +
         "): DeepSpeed's own engine records no checksums, so its files cannot be verified";
}

int verify_root(const Args& a, const std::string& root, IoEngine& engine, bool progress) {
  std::vector<std::string> skipped_raw;
  auto listed = list_checkpoints(root, &skipped_raw);
  if (!listed.is_ok()) return fail(kCommand, listed.status().to_string(), kExitFailure);
  // Committed checkpoints in order, then what list() skips as damaged, then directories under a
  // tag's name that hold checkpoint files but no manifest (list() ignores those silently).
  std::vector<std::string> tags;
  std::set<std::string> seen;
  for (const CheckpointInfo& c : *listed) {
    tags.push_back(c.tag);
    seen.insert(c.tag);
  }
  for (const SkippedDir& s : split_skipped(skipped_raw)) {
    if (seen.insert(s.tag).second) tags.push_back(s.tag);
  }
  std::error_code ec;
  std::vector<std::string> extra;
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    std::string name = entry.path().filename().string();
    if (seen.count(name) != 0 || !validate_tag(name).is_ok()) continue;
    PathKind kind = classify_path(entry.path().string()).kind;
    if (kind == PathKind::kCheckpoint || kind == PathKind::kIncompleteCheckpoint) {
      extra.push_back(name);
    }
  }
  std::sort(extra.begin(), extra.end());
  for (const std::string& name : extra) tags.push_back(name);

  const std::vector<ForeignTag> foreign = deepspeed_tags(root);
  int rc = verify_tags(
      a, root, tags,
      [&](const std::string& tag) { return verify_dir(root + "/" + tag, tag, engine, progress); },
      [&](const std::string& tag) {
        struct stat st {};
        return ::lstat((root + "/" + tag).c_str(), &st) != 0 && errno == ENOENT;
      });
  if (!a.json) {
    for (const ForeignTag& f : foreign) {
      std::cout << "UNVERIFIED " << f.tag << ": " << unverifiable_note(f) << "\n";
    }
  }
  return rc;
}

// A DeepSpeed tag written by DeepSpeed's own engine: nothing to check it against.
int verify_foreign_tag(const Args& a, const std::string& dir, const ForeignTag& f) {
  const std::string note = unverifiable_note(f);
  if (a.json) {
    nlohmann::ordered_json j = {{"kind", "deepspeed_tag"}, {"path", dir}, {"ok", false}};
    j["problems"] = nlohmann::ordered_json::array({note});
    std::cout << json_text(j) << "\n";
  } else {
    std::cout << "UNVERIFIED " << dir << ": " << note << "\n";
  }
  std::cout.flush();
  return kExitFailure;
}

// An object-store tier: every checkpoint fetched into a scratch folder and checked there.
int verify_object_tier(const Args& a, const std::string& url, IoEngine& engine) {
  auto objects = ObjectStoreRoot::open(url);
  if (!objects.is_ok()) return fail(kCommand, objects.status().to_string(), kExitFailure);
  auto scan = (*objects)->scan();
  if (!scan.is_ok()) return fail(kCommand, scan.status().to_string(), kExitFailure);
  std::vector<std::string> tags;
  for (const CheckpointInfo& c : scan->committed) tags.push_back(c.tag);
  for (const DamagedCheckpoint& d : scan->damaged) tags.push_back(d.tag);
  std::set<std::string> not_found;
  auto check = [&](const std::string& tag) {
    Outcome o;
    o.tag = tag;
    o.path = url + "/" + tag;
    auto start = std::chrono::steady_clock::now();
    auto report = (*objects)->verify(tag, engine);
    o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!report.is_ok() && report.status().code() == StatusCode::kNotFound) not_found.insert(tag);
    fill_outcome(o, report);
    return o;
  };
  return verify_tags(a, url, tags, check,
                     [&](const std::string& tag) { return not_found.count(tag) != 0; });
}

// Verifies `tags` of `root` in order with `check` and prints the outcome of each, then the
// summary. `vanished(tag)`: whether a checkpoint that failed went away meanwhile (another
// process's retention removed it): not damage.
int verify_tags(const Args& a, const std::string& root, const std::vector<std::string>& tags,
                const std::function<Outcome(const std::string&)>& check,
                const std::function<bool(const std::string&)>& vanished) {
  std::vector<Outcome> outcomes;
  std::vector<std::string> gone;  // removed while they were checked (another process's retention)
  size_t damaged = 0;
  for (const std::string& tag : tags) {
    Outcome o = check(tag);
    if (!o.ok() && vanished(tag)) {
      // Its files went missing because the whole checkpoint went: not damage.
      gone.push_back(tag);
      if (!a.json) std::cout << "GONE     " << tag << ": removed while it was checked\n";
      continue;
    }
    outcomes.push_back(std::move(o));
    if (!outcomes.back().ok()) ++damaged;
    const Outcome& done = outcomes.back();
    if (a.json) continue;
    if (done.ok()) {
      std::cout << "OK       " << tag << ": intact, " << speed(done) << "\n";
    } else {
      std::cout << "DAMAGED  " << tag << ": " << done.problems.size()
                << (done.problems.size() == 1 ? " problem" : " problems") << "\n";
      for (const std::string& p : done.problems) std::cout << "  - " << p << "\n";
    }
    std::cout.flush();
  }
  const bool ok = !outcomes.empty() && damaged == 0;
  if (a.json) {
    nlohmann::ordered_json j = {{"kind", "root"}, {"path", root}, {"ok", ok}};
    j["problems"] = nlohmann::ordered_json::array();
    j["checkpoints"] = nlohmann::ordered_json::array();
    for (const Outcome& o : outcomes) {
      for (const std::string& p : o.problems) j["problems"].push_back(o.tag + ": " + p);
      j["checkpoints"].push_back(outcome_json(o));
    }
    j["removed_while_checked"] = gone;
    if (outcomes.empty()) j["problems"].push_back("no checkpoints under " + root);
    std::cout << json_text(j) << "\n";
  } else if (outcomes.empty()) {
    std::cout << root << ": no checkpoints to verify\n";
  } else if (damaged == 0) {
    std::cout << (outcomes.size() == 1
                      ? "the checkpoint is"
                      : "all " + std::to_string(outcomes.size()) + " checkpoints are")
              << " intact\n";
  } else {
    std::cout << damaged << " of " << outcomes.size() << " checkpoints damaged\n";
  }
  std::cout.flush();
  return ok ? kExitOk : kExitFailure;
}

int verify_safetensors(const Args& a, const std::string& path) {
  auto header = read_safetensors_header(path);
  const std::string note =
      "header only: a plain safetensors file carries no checksums, so tensor data is not "
      "checked (checkpoint directories carry them: verify the directory)";
  if (a.json) {
    nlohmann::ordered_json j = {{"kind", "safetensors"},
                                {"path", path},
                                {"ok", header.is_ok()},
                                {"header_only", true},
                                {"note", note}};
    j["problems"] = nlohmann::ordered_json::array();
    if (!header.is_ok()) {
      j["problems"].push_back("invalid header: " + header.status().to_string());
    } else {
      j["num_tensors"] = header->tensors.size();
      j["data_bytes"] = header->data_bytes;
    }
    std::cout << json_text(j) << "\n";
  } else if (header.is_ok()) {
    std::cout << "OK       " << path << ": valid safetensors header (" << header->tensors.size()
              << (header->tensors.size() == 1 ? " tensor, " : " tensors, ")
              << format_bytes(header->data_bytes) << " of data)\n  " << note << "\n";
  } else {
    std::cout << "DAMAGED  " << path << ": invalid safetensors header\n  - "
              << header.status().to_string() << "\n";
  }
  std::cout.flush();
  return header.is_ok() ? kExitOk : kExitFailure;
}

}  // namespace

Command add_verify_command(CLI::App& parent) {
  auto args = std::make_shared<Args>();
  CLI::App* app = parent.add_subcommand(
      "verify",
      "Check every byte of a checkpoint (or of every checkpoint of a root) against its "
      "checksums; exit 1 when anything is damaged");
  app->add_option("PATH", args->path,
                  "Checkpoint directory, checkpoint root, or .safetensors file (header only)")
      ->required();
  app->add_flag("--json", args->json, "Print one JSON object instead of text");
  auto* progress_flag =
      app->add_flag("--progress", args->progress,
                    "Show a progress bar on stderr (default: when stderr is a terminal)");
  app->add_flag("--no-progress", args->no_progress, "Never show the progress bar")
      ->excludes(progress_flag);
  app->footer(
      "Exit status: 0 intact, 1 damaged (every problem is printed) or unreadable, 2 bad "
      "arguments.");
  return {app, [args] {
            if (is_object_store_url(args->path)) {
              auto engine = make_engine();
              if (!engine.is_ok()) return fail(kCommand, engine.status().to_string(), kExitFailure);
              return verify_object_tier(*args, args->path, **engine);
            }
            PathInfo p = classify_path(args->path);
            if (p.kind == PathKind::kMissing) return fail(kCommand, p.error, kExitUsage);
            if (p.kind == PathKind::kOtherFile || p.kind == PathKind::kTorchFile) {
              return fail(kCommand,
                          wrong_kind(p,
                                     "a checkpoint directory, a checkpoint root or a "
                                     "safetensors file"),
                          kExitUsage);
            }
            if (p.kind == PathKind::kSafetensors) return verify_safetensors(*args, p.path);
            auto engine = make_engine();
            if (!engine.is_ok()) {
              return fail(kCommand, "cannot start the I/O engine: " + engine.status().to_string(),
                          kExitFailure);
            }
            const bool progress = !args->no_progress && (args->progress || stderr_is_tty());
            if (p.kind == PathKind::kRoot) {
              if (auto foreign = detect_deepspeed_tag(p.path))
                return verify_foreign_tag(*args, p.path, *foreign);
            }
            // An incomplete directory is verified as a checkpoint: its report names what is
            // missing (exit 1), where a root would quietly hold no checkpoints.
            return p.kind == PathKind::kCheckpoint || p.kind == PathKind::kIncompleteCheckpoint
                       ? verify_checkpoint_dir(*args, p.path, **engine, progress)
                       : verify_root(*args, p.path, **engine, progress);
          }};
}

}  // namespace fastpersist::cli
