// SPDX-License-Identifier: Apache-2.0
// The on-disk names are a format: checkpoints written by every earlier version use them, so
// these values are pinned here (a change must be a deliberate format change).
#include "fastpersist/layout.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace fastpersist {
namespace {

TEST(LayoutTest, FixedNamesNeverChange) {
  EXPECT_EQ(kManifestFileName, "manifest.json");
  EXPECT_EQ(kObjectsFileName, "objects.pkl");
  EXPECT_EQ(kDataFilePrefix, "tensors-");
  EXPECT_EQ(kDataFileSuffix, ".safetensors");
  EXPECT_EQ(kLatestFileName, "latest");
  EXPECT_EQ(kLockFileName, ".lock");
  EXPECT_EQ(kTempDirPrefix, ".tmp-");
  EXPECT_EQ(kTrashDirPrefix, ".trash-");
  EXPECT_EQ(replace_temp_prefix(kLatestFileName), ".latest.tmp-");
  EXPECT_EQ(kWriterTempInfix, ".fp-tmp-");
  EXPECT_EQ(kParallelPartialSuffix, ".fp-partial");
  EXPECT_EQ(kParallelLockSuffix, ".lock");
  EXPECT_EQ(kParallelDoneSuffix, ".done");
  EXPECT_EQ(kRecordReplaceSuffix, ".new");
}

TEST(LayoutTest, DataFileNamesWithoutRankKeepTheV1Form) {
  EXPECT_EQ(data_file_name(0, 1), "tensors-00000-of-00001.safetensors");
  EXPECT_EQ(data_file_name(11, 12), "tensors-00011-of-00012.safetensors");
  EXPECT_EQ(data_file_name(123456, 200000), "tensors-123456-of-200000.safetensors");
}

TEST(LayoutTest, DataFileNamesWithRank) {
  EXPECT_EQ(data_file_name(0, 2, 3), "tensors-r00003-00000-of-00002.safetensors");
  EXPECT_EQ(data_file_name(1, 2, 0), "tensors-r00000-00001-of-00002.safetensors");
  EXPECT_EQ(data_file_name(0, 1, 4294967295u), "tensors-r4294967295-00000-of-00001.safetensors");
  // Ranks never collide with each other or with a single writer's names.
  std::set<std::string> names;
  for (uint32_t rank = 0; rank < 64; ++rank) {
    for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(names.insert(data_file_name(i, 3, rank)).second);
  }
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(names.insert(data_file_name(i, 3)).second);
}

TEST(LayoutTest, RecognisesDataFileNames) {
  EXPECT_TRUE(is_data_file_name(data_file_name(0, 1)));
  EXPECT_TRUE(is_data_file_name(data_file_name(4, 9, 12)));
  EXPECT_FALSE(is_data_file_name("tensors-.safetensors"));
  EXPECT_FALSE(is_data_file_name("model.safetensors"));
  EXPECT_FALSE(is_data_file_name("tensors-00000-of-00001.safetensors.tmp"));
  EXPECT_FALSE(is_data_file_name(kObjectsFileName));
  EXPECT_FALSE(is_data_file_name(""));
}

}  // namespace
}  // namespace fastpersist
