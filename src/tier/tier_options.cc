// SPDX-License-Identifier: Apache-2.0
#include <algorithm>
#include <filesystem>
#include <string>
#include <utility>

#include "fastpersist/tier.h"
#include "tier/tier_drain.h"

namespace fastpersist {

Status TierOptions::validate() const {
  auto bad = [&](const std::string& what) {
    return Status(StatusCode::kInvalidArgument,
                  "tier " + (path.empty() ? std::string("''") : path) + ": " + what);
  };
  if (path.empty()) return bad("the path is empty");
  if (keep_last && *keep_last == 0)
    return bad("keep_last must be at least 1 (the newest checkpoint is always kept)");
  if (keep_every && *keep_every < 1) return bad("keep_every must be at least 1");
  if (every && *every < 1) return bad("every must be at least 1");
  if (part_bytes < kMinTierPartBytes || part_bytes > kMaxTierPartBytes) {
    return bad("part_bytes must be between 5 MiB and 5 GiB (the part sizes S3 accepts), got " +
               std::to_string(part_bytes));
  }
  if (transfers < 1 || transfers > kMaxTierTransfers) {
    return bad("transfers must be between 1 and " + std::to_string(kMaxTierTransfers) + ", got " +
               std::to_string(transfers));
  }
  return Status::ok();
}

}  // namespace fastpersist

namespace fastpersist::checkpoint {

// Each tier valid, and no two of the local root and the tiers the same directory or one inside
// another (a tier inside the root would look like a damaged checkpoint there, and the root
// inside a tier like one in the tier).
Status check_tiers(const std::string& root, const std::vector<TierOptions>& tiers) {
  namespace fs = std::filesystem;
  std::vector<std::pair<fs::path, std::string>> places;
  std::error_code ec;
  places.emplace_back(fs::weakly_canonical(fs::absolute(root, ec), ec), "the local root");
  std::vector<std::string> urls;
  for (const TierOptions& t : tiers) {
    FP_RETURN_IF_ERROR(t.validate());
    if (t.is_object_store()) {
      const std::string url = t.store ? t.store->url() : t.path;
      if (std::find(urls.begin(), urls.end(), url) != urls.end()) {
        return Status(StatusCode::kInvalidArgument,
                      "tier " + url + " is given twice: each tier needs a place of its own");
      }
      urls.push_back(url);
      continue;
    }
    places.emplace_back(fs::weakly_canonical(fs::absolute(t.path, ec), ec), "tier " + t.path);
  }
  auto inside = [](const fs::path& a, const fs::path& b) {  // a == b or a under b
    auto [ai, bi] = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
    return bi == b.end();
  };
  for (size_t i = 0; i < places.size(); ++i) {
    for (size_t j = 0; j < places.size(); ++j) {
      if (i == j || !inside(places[i].first, places[j].first)) continue;
      return Status(
                 StatusCode::kInvalidArgument,
                 places[i].second + " (" + places[i].first.string() + ") is " +
                     (places[i].first == places[j].first ? "the same directory as " : "inside ") +
                     places[j].second + ": each tier needs a directory of its own")
          .with_path(places[i].first.string());
    }
  }
  return Status::ok();
}

}  // namespace fastpersist::checkpoint
