// SPDX-License-Identifier: Apache-2.0
#include "checkpoint/retention.h"

#include <algorithm>
#include <cstddef>
#include <map>
#include <set>

#include "checkpoint_dir/checkpoint_fs.h"
#include "fastpersist/checkpoint_reader.h"

namespace fastpersist::checkpoint {
namespace {

bool is_milestone(std::optional<int64_t> step, std::optional<int64_t> keep_every) {
  return keep_every && *keep_every > 0 && step && *step % *keep_every == 0;
}

}  // namespace

std::vector<std::string> select_for_removal(const std::vector<CheckpointInfo>& committed,
                                            std::optional<unsigned> keep_last,
                                            std::optional<int64_t> keep_every) {
  std::vector<std::string> remove;
  if (!keep_last || committed.empty()) return remove;  // keep_every alone keeps everything
  size_t keep = std::max<size_t>(*keep_last, 1);       // the newest always stays
  if (committed.size() <= keep) return remove;
  size_t first_kept = committed.size() - keep;
  for (size_t i = 0; i < first_kept; ++i) {
    const CheckpointInfo& c = committed[i];
    if (!is_milestone(c.step, keep_every)) remove.push_back(c.tag);
  }
  return remove;
}

std::vector<std::string> select_damaged_for_removal(const RootScan& scan,
                                                    std::optional<unsigned> keep_last,
                                                    std::optional<int64_t> keep_every) {
  std::vector<std::string> remove;
  if (!keep_last) return remove;
  const size_t keep = std::max<size_t>(*keep_last, 1);
  for (const DamagedCheckpoint& d : scan.damaged) {
    if (!d.sequence || is_milestone(d.step, keep_every)) continue;
    // Had it been intact, it would go once `keep` valid checkpoints are newer than it.
    size_t newer = static_cast<size_t>(
        std::count_if(scan.committed.begin(), scan.committed.end(),
                      [&](const CheckpointInfo& c) { return c.sequence > *d.sequence; }));
    if (newer >= keep) remove.push_back(d.tag);
  }
  return remove;
}

std::vector<std::string> demote_damaged(
    RootScan* scan, unsigned keep_last,
    const std::function<std::string(const CheckpointInfo&)>& check) {
  std::vector<std::string> found;
  const size_t want = std::max<size_t>(keep_last, 1);
  size_t intact = 0;
  std::vector<CheckpointInfo>& committed = scan->committed;
  for (size_t i = committed.size(); i-- > 0 && intact < want;) {
    std::string problem = check(committed[i]);
    if (problem.empty()) {
      ++intact;
      continue;
    }
    const CheckpointInfo& c = committed[i];
    found.push_back(c.tag + ": " + problem);
    scan->damaged.push_back({c.tag, problem, c.sequence, c.step, c.references});
    committed.erase(committed.begin() + static_cast<std::ptrdiff_t>(i));
  }
  return found;
}

std::vector<std::string> demote_damaged(RootScan* scan, unsigned keep_last, const std::string& root,
                                        IoEngine& engine) {
  return demote_damaged(scan, keep_last, [&](const CheckpointInfo& c) {
    auto report = verify_checkpoint(join_path(root, c.tag), engine);
    if (!report.is_ok()) return report.status().to_string();
    return report->problems.empty() ? std::string() : report->problems.front();
  });
}

RetentionDecision decide_retention(const RootScan& scan, std::optional<unsigned> keep_last,
                                   std::optional<int64_t> keep_every) {
  RetentionDecision d;
  std::vector<std::string> selected = select_for_removal(scan.committed, keep_last, keep_every);
  for (std::string& tag : select_damaged_for_removal(scan, keep_last, keep_every))
    selected.push_back(std::move(tag));
  std::set<std::string> remove(selected.begin(), selected.end());
  // A kept checkpoint keeps every checkpoint it references (its base), and that one in turn
  // keeps its own: repeated until nothing changes (bases are full today, so once is enough).
  std::map<std::string, std::vector<std::string>> kept_for;
  auto protect = [&](const std::string& tag, const std::vector<std::string>& refs) {
    bool changed = false;
    if (remove.count(tag) != 0) return changed;
    for (const std::string& r : refs) {
      if (remove.erase(r) != 0) changed = true;
      std::vector<std::string>& users = kept_for[r];
      if (std::find(users.begin(), users.end(), tag) == users.end()) users.push_back(tag);
    }
    return changed;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (const CheckpointInfo& c : scan.committed)
      changed = protect(c.tag, c.references) || changed;
    for (const DamagedCheckpoint& x : scan.damaged)
      changed = protect(x.tag, x.references) || changed;
  }
  // Users before their bases: a checkpoint goes only once nothing left to remove references it,
  // so no one looking at the root meanwhile (a concurrent verify, a crash between two removals)
  // sees an incremental checkpoint whose base is already gone.
  std::map<std::string, std::vector<std::string>> refs_of;
  for (const CheckpointInfo& c : scan.committed) refs_of[c.tag] = c.references;
  for (const DamagedCheckpoint& x : scan.damaged) refs_of[x.tag] = x.references;
  std::vector<std::string> pending;
  for (const std::string& tag : selected) {
    if (remove.count(tag) != 0) pending.push_back(tag);
  }
  while (!pending.empty()) {
    std::vector<std::string> later;
    for (const std::string& tag : pending) {
      bool used = std::any_of(pending.begin(), pending.end(), [&](const std::string& other) {
        const std::vector<std::string>& r = refs_of[other];
        return other != tag && std::find(r.begin(), r.end(), tag) != r.end();
      });
      (used ? later : d.remove).push_back(tag);
    }
    if (later.size() == pending.size()) {  // a cycle (only a forged root has one): as selected
      d.remove.insert(d.remove.end(), later.begin(), later.end());
      break;
    }
    pending.swap(later);
  }
  const size_t keep = keep_last ? std::max<size_t>(*keep_last, 1) : 0;
  for (size_t i = 0; i < scan.committed.size(); ++i) {
    const CheckpointInfo& c = scan.committed[i];
    if (remove.count(c.tag) != 0) continue;
    std::vector<std::string> why;
    if (i + 1 == scan.committed.size()) {
      why.push_back("the newest");
    } else if (!keep_last) {
      why.push_back("no keep-last policy");
    } else if (scan.committed.size() - i <= keep) {
      why.push_back("one of the newest " + std::to_string(keep));
    }
    if (is_milestone(c.step, keep_every)) {
      why.push_back("a milestone (step " + std::to_string(*c.step) + " is a multiple of " +
                    std::to_string(*keep_every) + ")");
    }
    auto users = kept_for.find(c.tag);
    if (users != kept_for.end()) {
      std::string names;
      for (const std::string& u : users->second) names += (names.empty() ? "" : ", ") + u;
      why.push_back("the base of " + names + " (incremental, kept)");
    }
    std::string text;
    for (const std::string& w : why) text += (text.empty() ? "" : "; ") + w;
    d.kept.push_back({c.tag, text});
  }
  return d;
}

std::vector<std::string> select_all_for_removal(const RootScan& scan,
                                                std::optional<unsigned> keep_last,
                                                std::optional<int64_t> keep_every) {
  return decide_retention(scan, keep_last, keep_every).remove;
}

}  // namespace fastpersist::checkpoint
