// SPDX-License-Identifier: Apache-2.0
// DeepSpeed tags without a manifest are recognized by their top-level files only: never through
// a symlink, never with a manifest, never from names that are not DeepSpeed's.
#include "fastpersist/foreign_checkpoint.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "testing/status_matchers.h"
#include "testing/temp_dir.h"
#include "testing/test_util.h"

namespace fastpersist::testing {
namespace {

void write(const std::string& path, size_t bytes) {
  FP_ASSERT_OK(write_whole_file(path, random_bytes(bytes, 1)));
}

TEST(ForeignCheckpoint, FindsDeepSpeedTagsWithoutAManifest) {
  TempDir root;
  namespace fs = std::filesystem;
  fs::create_directory(root.file("global_step3"));
  write(root.file("global_step3/mp_rank_00_model_states.pt"), 100);
  write(root.file("global_step3/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"), 250);
  write(root.file("global_step3/notes.txt"), 7);  // not DeepSpeed's: not counted
  fs::create_directory(root.file("ours"));        // committed by fastpersist: a manifest
  write(root.file("ours/mp_rank_00_model_states.pt"), 10);
  write(root.file("ours/manifest.json"), 10);
  fs::create_directory(root.file("empty"));
  fs::create_directory(root.file(".tmp-x-1"));  // not a valid tag name
  write(root.file(".tmp-x-1/mp_rank_00_model_states.pt"), 10);
  fs::create_directory(root.file("elsewhere"));
  write(root.file("elsewhere/mp_rank_00_model_states.pt"), 10);
  fs::create_directory_symlink(root.file("elsewhere"), root.file("link"));  // never followed
  fs::create_directory(root.file("linked_file"));
  fs::create_symlink(root.file("elsewhere/mp_rank_00_model_states.pt"),
                     root.file("linked_file/mp_rank_00_model_states.pt"));

  auto tags = deepspeed_tags(root.path());
  ASSERT_EQ(tags.size(), 2u);
  EXPECT_EQ(tags[0].tag, "elsewhere");
  EXPECT_EQ(tags[1].tag, "global_step3");
  EXPECT_EQ(tags[1].kind, "deepspeed");
  EXPECT_EQ(tags[1].files, 2u);
  EXPECT_EQ(tags[1].bytes, 350u);
  ASSERT_EQ(tags[1].listing.size(), 2u);
  EXPECT_EQ(tags[1].listing[0].first, "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt");
  EXPECT_EQ(tags[1].listing[1].second, 100u);

  EXPECT_FALSE(detect_deepspeed_tag(root.file("ours")).has_value());
  EXPECT_FALSE(detect_deepspeed_tag(root.file("link")).has_value());
  EXPECT_FALSE(detect_deepspeed_tag(root.file("linked_file")).has_value());
  EXPECT_FALSE(detect_deepspeed_tag(root.file("missing")).has_value());
  EXPECT_FALSE(detect_deepspeed_tag(root.file("global_step3/notes.txt")).has_value());
  auto one = detect_deepspeed_tag(root.file("global_step3") + "/");
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->tag, "global_step3");
  EXPECT_TRUE(deepspeed_tags(root.file("missing")).empty());
}

}  // namespace
}  // namespace fastpersist::testing
