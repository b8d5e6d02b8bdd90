// SPDX-License-Identifier: Apache-2.0
// Where checkpoints live across a root and its tiers, and pulling one back.
#include <algorithm>
#include <map>
#include <utility>

#include "checkpoint/root_scan.h"
#include "checkpoint_dir/checkpoint_fs.h"
#include "fastpersist/checkpoint_reader.h"
#include "tier/object_tier.h"
#include "tier/tier_drain.h"

namespace fastpersist::checkpoint {

std::vector<CheckpointPlace> merge_places(
    const std::vector<std::string>& roots,
    const std::vector<Result<std::vector<CheckpointInfo>>>& listings,
    std::vector<std::string>* unreachable) {
  std::vector<CheckpointPlace> places;
  std::map<std::pair<std::string, double>, size_t> index;  // (tag, created) -> places[i]
  for (size_t r = 0; r < roots.size(); ++r) {
    if (!listings[r].is_ok()) {
      if (unreachable != nullptr)
        unreachable->push_back(roots[r] + ": " + listings[r].status().to_string());
      continue;
    }
    for (const CheckpointInfo& c : *listings[r]) {
      auto [it, added] = index.emplace(std::make_pair(c.tag, c.created_unix), places.size());
      if (added) places.push_back(CheckpointPlace{c, {}, r == 0});
      places[it->second].roots.push_back(roots[r]);
    }
  }
  std::stable_sort(places.begin(), places.end(),
                   [](const CheckpointPlace& a, const CheckpointPlace& b) {
                     return a.info.created_unix < b.info.created_unix;
                   });
  return places;
}

Result<uint64_t> copy_with_bases(const TierOptions& tier, const std::string& tag,
                                 IoEngine& read_engine, CheckpointManager& destination) {
  FP_RETURN_IF_ERROR(validate_tag(tag));
  if (tier.is_object_store()) {
    FP_ASSIGN_OR_RETURN(std::unique_ptr<ObjectTier> objects, open_object_tier(tier));
    FP_ASSIGN_OR_RETURN(Manifest m, objects->read_manifest(tag));
    uint64_t bytes = 0;
    for (const std::string& base : referenced_tags(m)) {
      FP_ASSIGN_OR_RETURN(CopyResult b, objects->download(base, destination, read_engine));
      bytes += b.bytes;
    }
    FP_ASSIGN_OR_RETURN(CopyResult c, objects->download(tag, destination, read_engine));
    return bytes + c.bytes;
  }
  const std::string& source_root = tier.path;
  FP_ASSIGN_OR_RETURN(Manifest m, read_manifest(join_path(source_root, tag)));
  uint64_t bytes = 0;
  for (const std::string& base : referenced_tags(m)) {
    FP_ASSIGN_OR_RETURN(CopyResult b, copy_checkpoint(source_root, base, read_engine, destination));
    bytes += b.bytes;
  }
  FP_ASSIGN_OR_RETURN(CopyResult c, copy_checkpoint(source_root, tag, read_engine, destination));
  return bytes + c.bytes;
}

std::vector<CheckpointPlace> locate_in_tiers(const std::string& local_root,
                                             const std::vector<CheckpointInfo>& local,
                                             const std::vector<TierOptions>& tiers,
                                             std::vector<std::string>* unreachable) {
  std::vector<std::string> roots{local_root};
  std::vector<Result<std::vector<CheckpointInfo>>> listings{local};
  for (const TierOptions& t : tiers) {
    roots.push_back(t.path);
    listings.push_back(list_tier(t));
  }
  return merge_places(roots, listings, unreachable);
}

std::vector<CheckpointPlace> TierDrainer::locations(const std::vector<CheckpointInfo>& local,
                                                    std::vector<std::string>* unreachable) {
  return locate_in_tiers(setup_.local_root, local, setup_.tiers, unreachable);
}

Result<uint64_t> TierDrainer::pull(const TierOptions& tier, const std::string& tag,
                                   IoEngine& read_engine, CheckpointManager& destination) {
  return copy_with_bases(tier, tag, read_engine, destination);
}

}  // namespace fastpersist::checkpoint
