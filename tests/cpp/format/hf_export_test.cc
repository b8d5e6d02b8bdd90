// SPDX-License-Identifier: Apache-2.0
// The Hugging Face export layout (fastpersist/hf_export.h): files filled in order up to the
// limit, one file without an index, shards with an index that maps every tensor to its file.
#include "fastpersist/hf_export.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace fastpersist {
namespace {

TEST(HfExportPlan, TensorsThatFitMakeOneFileWithoutAnIndex) {
  Result<HfExportPlan> plan = plan_hf_export({{"a", 10}, {"b", 20}}, 30);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  EXPECT_EQ(plan->files, (std::vector<std::string>{"model.safetensors"}));
  EXPECT_EQ(plan->file_of, (std::vector<size_t>{0, 0}));
  EXPECT_EQ(plan->index_json, "");
  Result<HfExportPlan> none = plan_hf_export({}, 30);
  ASSERT_TRUE(none.is_ok());
  EXPECT_EQ(none->files, (std::vector<std::string>{"model.safetensors"}));
  EXPECT_TRUE(none->file_of.empty());
}

TEST(HfExportPlan, ShardsFillInOrderAndTheIndexMapsEveryTensor) {
  // 10 + 20 fit 30; 5 would not; 40 is over the limit alone and gets a file of its own.
  Result<HfExportPlan> plan =
      plan_hf_export({{"a", 10}, {"b", 20}, {"c", 5}, {"d", 40}, {"e", 1}}, 30);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  EXPECT_EQ(plan->files,
            (std::vector<std::string>{
                "model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
                "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors"}));
  EXPECT_EQ(plan->file_of, (std::vector<size_t>{0, 0, 1, 2, 3}));
  nlohmann::json index = nlohmann::json::parse(plan->index_json);
  EXPECT_EQ(index["metadata"]["total_size"], 76);
  EXPECT_EQ(index["weight_map"]["a"], "model-00001-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["c"], "model-00002-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["d"], "model-00003-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["e"], "model-00004-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"].size(), 5u);
}

TEST(HfExportPlan, ALimitOfZeroGivesEveryTensorItsFile) {
  Result<HfExportPlan> plan = plan_hf_export({{"a", 0}, {"b", 1}}, 0);
  ASSERT_TRUE(plan.is_ok());
  EXPECT_EQ(plan->file_of, (std::vector<size_t>{0, 1}));
}

TEST(HfExportPlan, HugeSizesDoNotOverflow) {
  Result<HfExportPlan> plan = plan_hf_export({{"a", UINT64_MAX - 1}, {"b", 1}}, UINT64_MAX);
  ASSERT_TRUE(plan.is_ok());
  EXPECT_EQ(plan->file_of, (std::vector<size_t>{0, 0}));
  EXPECT_EQ(plan_hf_export({{"a", UINT64_MAX}, {"b", 1}}, 10).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(HfExportPlan, NamesMustBeUniqueAndNonEmpty) {
  EXPECT_EQ(plan_hf_export({{"a", 1}, {"a", 2}}, 10).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(plan_hf_export({{"", 1}}, 10).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fastpersist
