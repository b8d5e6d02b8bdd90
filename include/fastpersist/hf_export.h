// SPDX-License-Identifier: Apache-2.0
// The folder a Hugging Face model export writes (what `from_pretrained` reads): one
// model.safetensors, or, when the tensors do not fit one file of max_shard_size bytes,
// model-00001-of-0000N.safetensors ... plus model.safetensors.index.json mapping each tensor to
// its file ({"metadata": {"total_size": <bytes>}, "weight_map": {name: file}}).
//
// Tensors go into files in the order given, a new file starting when the next tensor would take
// the current one over the limit (a tensor larger than the limit gets a file of its own), as
// transformers' own save_pretrained shards. Python's CheckpointManager.export_hf writes the
// files this plan names; nothing else decides the layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fastpersist/status.h"

namespace fastpersist {

inline constexpr std::string_view kHfSingleFileName = "model.safetensors";
inline constexpr std::string_view kHfIndexFileName = "model.safetensors.index.json";

struct HfExportTensor {
  std::string name;
  uint64_t bytes = 0;
};

struct HfExportPlan {
  std::vector<std::string> files;  // the data files, in order
  std::vector<size_t> file_of;     // for each tensor as given: its file (an index into files)
  // The content of model.safetensors.index.json; empty when there is one file (no index).
  std::string index_json;
};

// kInvalidArgument for an empty or repeated tensor name, or a total size beyond 2^64 - 1.
Result<HfExportPlan> plan_hf_export(const std::vector<HfExportTensor>& tensors,
                                    uint64_t max_shard_bytes);

}  // namespace fastpersist
