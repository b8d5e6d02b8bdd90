// SPDX-License-Identifier: Apache-2.0
// `fastpersist list ROOT`: the committed checkpoints of a root, oldest to newest, the one
// `latest` names, and the directories that look like checkpoints but would not load (with the
// reason). Reads manifests only (cheap); `fastpersist verify ROOT` checks every byte.
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint_paths.h"
#include "command.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/foreign_checkpoint.h"
#include "fastpersist/layout.h"
#include "fastpersist/maintenance.h"
#include "fastpersist/object_store.h"
#include "format.h"

namespace fastpersist::cli {

namespace {

// Where the checkpoints of `root` and its tiers live: per local tag, the tiers holding the same
// checkpoint (same tag and creation time); the checkpoints only tiers hold; unreachable tiers.
struct TierView {
  std::map<std::string, std::vector<std::string>> also_in;
  std::vector<CheckpointPlace> only_in_tiers;
  std::vector<std::string> unreachable;
};

TierView tier_view(const std::string& root, const std::vector<CheckpointInfo>& local,
                   const std::vector<std::string>& tiers) {
  TierView v;
  for (CheckpointPlace& p : locate_checkpoints(root, local, tiers, &v.unreachable)) {
    if (!p.local) {
      v.only_in_tiers.push_back(std::move(p));
      continue;
    }
    v.also_in[p.info.tag].assign(p.roots.begin() + 1, p.roots.end());
  }
  return v;
}

// What <root>/latest says (its first line), "" when there is none: DeepSpeed's engine writes it
// without a newline, fastpersist with one.
std::string latest_pointer_text(const std::string& root) {
  std::ifstream in(root + "/" + std::string(kLatestFileName));
  std::string line;
  if (!in || !std::getline(in, line) || line.size() > 4096) return "";
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  return line;
}

std::string joined_or_dash(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ",") + s;
  return out.empty() ? "-" : out;
}

// Everything `list` shows of a root, gathered before anything is printed.
struct RootListing {
  std::vector<CheckpointInfo> checkpoints;  // oldest to newest
  std::optional<std::string> latest_tag;
  TierView tiers;  // empty without --tier
  std::vector<SkippedDir> skipped;
  // Tags another engine wrote next to ours (DeepSpeed's own): listed, never verifiable.
  std::vector<ForeignTag> foreign;
};

Result<RootListing> gather_root_listing(const std::string& root,
                                        const std::vector<std::string>& tiers) {
  RootListing out;
  FP_ASSIGN_OR_RETURN(RootScan scan, scan_any_root(root));
  out.checkpoints = std::move(scan.committed);
  for (DamagedCheckpoint& d : scan.damaged) out.skipped.push_back({d.tag, std::move(d.reason)});
  if (!tiers.empty()) out.tiers = tier_view(root, out.checkpoints, tiers);
  if (is_object_store_url(root)) {
    // An object store has no pointer to read: the newest committed checkpoint is the latest.
    if (!out.checkpoints.empty()) out.latest_tag = out.checkpoints.back().tag;
    return out;
  }
  FP_ASSIGN_OR_RETURN(out.latest_tag, latest_checkpoint(root));
  out.foreign = deepspeed_tags(root);
  return out;
}

nlohmann::ordered_json step_json(const std::optional<int64_t>& step) {
  return step ? nlohmann::ordered_json(*step) : nlohmann::ordered_json(nullptr);
}

// One checkpoint of `list --json`; `also_in` (the tiers holding it) only with --tier.
nlohmann::ordered_json checkpoint_json(const RootListing& l, const CheckpointInfo& c,
                                       bool with_tiers) {
  nlohmann::ordered_json j = {{"tag", c.tag},
                              {"step", step_json(c.step)},
                              {"sequence", c.sequence},
                              {"created_unix", c.created_unix},
                              {"created", iso_time_utc(c.created_unix)},
                              {"tensor_bytes", c.tensor_bytes},
                              {"total_bytes", c.total_bytes},
                              {"own_bytes", c.own_bytes},
                              {"num_tensors", c.num_tensors},
                              {"references", c.references},
                              {"latest", l.latest_tag && *l.latest_tag == c.tag}};
  if (with_tiers) {
    auto it = l.tiers.also_in.find(c.tag);
    j["tiers"] = it == l.tiers.also_in.end() ? std::vector<std::string>{} : it->second;
  }
  return j;
}

nlohmann::ordered_json root_listing_json(const std::string& root, const RootListing& l,
                                         bool with_tiers) {
  nlohmann::ordered_json j;
  j["kind"] = std::string(path_kind_name(PathKind::kRoot));
  j["root"] = root;
  j["latest"] =
      l.latest_tag ? nlohmann::ordered_json(*l.latest_tag) : nlohmann::ordered_json(nullptr);
  j["checkpoints"] = nlohmann::ordered_json::array();
  for (const CheckpointInfo& c : l.checkpoints)
    j["checkpoints"].push_back(checkpoint_json(l, c, with_tiers));
  if (with_tiers) {
    j["only_in_tiers"] = nlohmann::ordered_json::array();
    for (const CheckpointPlace& p : l.tiers.only_in_tiers) {
      j["only_in_tiers"].push_back({{"tag", p.info.tag},
                                    {"step", step_json(p.info.step)},
                                    {"created_unix", p.info.created_unix},
                                    {"tiers", p.roots}});
    }
    j["unreachable_tiers"] = l.tiers.unreachable;
  }
  j["skipped"] = nlohmann::ordered_json::array();
  for (const SkippedDir& s : l.skipped)
    j["skipped"].push_back({{"tag", s.tag}, {"reason", s.reason}});
  j["foreign_tags"] = nlohmann::ordered_json::array();
  for (const ForeignTag& f : l.foreign) {
    j["foreign_tags"].push_back(
        {{"tag", f.tag}, {"kind", f.kind}, {"files", f.files}, {"bytes", f.bytes}});
  }
  return j;
}

// The text table's cells: a header row, then one row per checkpoint. An incremental
// checkpoint's SIZE is its own bytes, and BASE names the checkpoints it references (the rest).
std::vector<std::vector<std::string>> checkpoint_rows(const RootListing& l, bool with_tiers) {
  std::vector<std::vector<std::string>> rows = {
      {"TAG", "STEP", "CREATED (UTC)", "SIZE", "TENSORS", "BASE"}};
  if (with_tiers) rows[0].push_back("ALSO IN");
  for (const CheckpointInfo& c : l.checkpoints) {
    rows.push_back({c.tag, c.step ? std::to_string(*c.step) : "-", iso_time_utc(c.created_unix),
                    format_bytes(c.own_bytes), std::to_string(c.num_tensors),
                    joined_or_dash(c.references)});
    if (with_tiers) {
      auto it = l.tiers.also_in.find(c.tag);
      rows.back().push_back(it == l.tiers.also_in.end() ? "-" : joined_or_dash(it->second));
    }
  }
  return rows;
}

// The checkpoints as aligned columns, the latest marked with '*'.
void print_checkpoint_table(const RootListing& l,
                            const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths(rows[0].size(), 0);
  for (const auto& r : rows) {
    for (size_t i = 0; i < r.size(); ++i) widths[i] = std::max(widths[i], r[i].size());
  }
  for (size_t k = 0; k < rows.size(); ++k) {
    bool is_latest = k > 0 && l.latest_tag && *l.latest_tag == l.checkpoints[k - 1].tag;
    std::string line = is_latest ? "* " : "  ";
    for (size_t i = 0; i < rows[k].size(); ++i) {
      line += i + 1 < rows[k].size() ? pad(rows[k][i], widths[i] + 2) : rows[k][i];
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::cout << line << "\n";
  }
  std::cout << "(* = latest)\n";
}

// The checkpoints only a tier holds, and the tiers that could not be listed.
void print_tier_notes(const TierView& view) {
  for (const CheckpointPlace& p : view.only_in_tiers) {
    std::cout << "only in " << joined_or_dash(p.roots) << ": " << p.info.tag << " (step "
              << (p.info.step ? std::to_string(*p.info.step) : "-") << ", "
              << iso_time_utc(p.info.created_unix) << ")\n";
  }
  for (const std::string& u : view.unreachable) std::cout << "tier unreachable: " << u << "\n";
}

void print_skipped(const std::vector<SkippedDir>& skipped) {
  if (skipped.empty()) return;
  std::cout << "skipped " << skipped.size() << (skipped.size() == 1 ? " directory" : " directories")
            << " that would not load (run `fastpersist verify` on them):\n";
  for (const SkippedDir& s : skipped) std::cout << "  " << s.tag << ": " << s.reason << "\n";
}

void print_foreign_tags(const std::string& root, const std::vector<ForeignTag>& foreign) {
  if (foreign.empty()) return;
  std::cout << foreign.size() << (foreign.size() == 1 ? " DeepSpeed tag" : " DeepSpeed tags")
            << " without a fastpersist manifest (written by DeepSpeed's own engine: no checksums, "
               "so they cannot be verified; they load through fastpersist.deepspeed):\n";
  const std::string pointer = latest_pointer_text(root);
  for (const ForeignTag& f : foreign) {
    std::cout << "  " << f.tag << ": " << f.files << (f.files == 1 ? " file, " : " files, ")
              << format_bytes(f.bytes) << (pointer == f.tag ? " (the `latest` file names it)" : "")
              << "\n";
  }
}

void print_root_text(const std::string& root, const RootListing& l, bool with_tiers) {
  std::cout << root << ": ";
  if (l.checkpoints.empty()) {
    std::cout << "no committed checkpoints\n";
  } else {
    std::cout << l.checkpoints.size()
              << (l.checkpoints.size() == 1 ? " checkpoint" : " checkpoints") << ", latest "
              << l.latest_tag.value_or("-") << "\n";
    print_checkpoint_table(l, checkpoint_rows(l, with_tiers));
  }
  print_tier_notes(l.tiers);
  print_skipped(l.skipped);
  print_foreign_tags(root, l.foreign);
}

}  // namespace

int print_root_listing(const std::string& command, const std::string& root, bool json,
                       const std::vector<std::string>& tiers) {
  Result<RootListing> listing = gather_root_listing(root, tiers);
  if (!listing.is_ok()) return fail(command, listing.status().to_string(), kExitFailure);
  if (json) {
    std::cout << json_text(root_listing_json(root, *listing, !tiers.empty())) << "\n";
  } else {
    print_root_text(root, *listing, !tiers.empty());
  }
  std::cout.flush();
  return kExitOk;
}

Command add_list_command(CLI::App& parent) {
  struct Args {
    std::string root;
    std::vector<std::string> tiers;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* app = parent.add_subcommand(
      "list", "The committed checkpoints of a root, oldest to newest, and damaged directories");
  app->add_option("ROOT", args->root, "Checkpoint root (the directory a CheckpointManager uses)")
      ->required();
  app->add_option("--tier", args->tiers,
                  "A tier of this root (repeatable): also show where each checkpoint lives, and "
                  "the checkpoints only a tier holds");
  app->add_flag("--json", args->json, "Print one JSON object instead of text");
  return {app, [args] {
            if (is_object_store_url(args->root)) {
              return print_root_listing("list", args->root, args->json, args->tiers);
            }
            PathInfo p = classify_path(args->root);
            switch (p.kind) {
              case PathKind::kMissing:
                return fail("list", p.error, kExitUsage);
              case PathKind::kRoot:
                return print_root_listing("list", args->root, args->json, args->tiers);
              case PathKind::kCheckpoint:
                return fail("list",
                            args->root +
                                " is a checkpoint directory, not a root; "
                                "`fastpersist inspect " +
                                args->root + "` describes it",
                            kExitUsage);
              case PathKind::kIncompleteCheckpoint:
                return fail("list", wrong_kind(p, "a checkpoint root"), kExitUsage);
              case PathKind::kSafetensors:
              case PathKind::kTorchFile:
              case PathKind::kOtherFile:
                break;
            }
            return fail("list",
                        args->root +
                            " is a file, not a checkpoint root (a directory); "
                            "`fastpersist inspect` describes safetensors files",
                        kExitUsage);
          }};
}

}  // namespace fastpersist::cli
