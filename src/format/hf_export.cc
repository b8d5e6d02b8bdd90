// SPDX-License-Identifier: Apache-2.0
// See fastpersist/hf_export.h.
#include "fastpersist/hf_export.h"

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

namespace fastpersist {
namespace {

std::string shard_file_name(size_t index, size_t count) {
  char name[64];
  std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return name;
}

}  // namespace

Result<HfExportPlan> plan_hf_export(const std::vector<HfExportTensor>& tensors,
                                    uint64_t max_shard_bytes) {
  HfExportPlan plan;
  std::set<std::string_view> names;
  uint64_t total = 0;
  size_t shards = 1;
  uint64_t in_shard = 0;  // bytes in the last file
  for (const HfExportTensor& t : tensors) {
    if (t.name.empty()) return Status(StatusCode::kInvalidArgument, "a tensor has no name");
    if (!names.insert(t.name).second) {
      return Status(StatusCode::kInvalidArgument, "tensor name '" + t.name + "' repeats");
    }
    if (t.bytes > UINT64_MAX - total) {
      return Status(StatusCode::kInvalidArgument, "the tensors' total size is beyond 2^64 - 1");
    }
    total += t.bytes;
    // in_shard + t.bytes > max_shard_bytes, without overflow; the first tensor always fits.
    const bool over = in_shard > max_shard_bytes || t.bytes > max_shard_bytes - in_shard;
    if (!plan.file_of.empty() && over) {
      ++shards;
      in_shard = 0;
    }
    plan.file_of.push_back(shards - 1);
    in_shard += t.bytes;  // at most total: no overflow
  }
  if (shards == 1) {
    plan.files.emplace_back(kHfSingleFileName);
    return plan;
  }
  for (size_t i = 0; i < shards; ++i) plan.files.push_back(shard_file_name(i, shards));
  nlohmann::ordered_json index;
  index["metadata"]["total_size"] = total;
  nlohmann::ordered_json& weight_map = index["weight_map"];
  weight_map = nlohmann::ordered_json::object();
  for (size_t k = 0; k < tensors.size(); ++k)
    weight_map[tensors[k].name] = plan.files[plan.file_of[k]];
  plan.index_json = index.dump(2);
  return plan;
}

}  // namespace fastpersist
