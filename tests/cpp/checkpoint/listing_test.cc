// SPDX-License-Identifier: Apache-2.0
// What list_checkpoints counts as a checkpoint: only directories with a valid tag name and a
// manifest that passes the cheap checks. The manager's own files, foreign files and folders
// are neither listed nor reported as damaged.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/checkpoint_test_util.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace fastpersist::testing {
namespace {

TEST(ListingTest, ForeignEntriesAreNeitherListedNorSkipped) {
  TempDir dir;
  TestState s;
  s.add("w", "F32", {8}, 1);
  FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir.path(), small_options()));
  FP_ASSERT_OK(mgr->save("real", s.content()));
  write_text(dir.file("notes.txt"), "a file with a tag-like name");
  write_text(dir.file("train.log"), "");
  ASSERT_EQ(::mkdir(dir.file("tensorboard").c_str(), 0755), 0);
  ASSERT_EQ(::symlink("/nonexistent/target", dir.file("dangling").c_str()), 0);
  ASSERT_EQ(::mkdir(dir.file("has space").c_str(), 0755), 0);  // not a tag at all
  write_text(dir.file("has space/manifest.json"), "garbage");

  std::vector<std::string> skipped;
  FP_ASSERT_OK_AND_ASSIGN(auto listed, list_checkpoints(dir.path(), &skipped));
  EXPECT_EQ(tags_of(listed), (std::vector<std::string>{"real"}));
  EXPECT_TRUE(skipped.empty()) << joined(skipped);
  FP_ASSERT_OK_AND_ASSIGN(auto latest, latest_checkpoint(dir.path()));
  EXPECT_EQ(latest, std::optional<std::string>("real"));

  // The manager reopens such a root and keeps saving.
  FP_ASSERT_OK(mgr->close());
  FP_ASSERT_OK_AND_ASSIGN(auto again, CheckpointManager::open(dir.path(), small_options()));
  FP_ASSERT_OK(again->save("second", s.content()));
  EXPECT_EQ(listed_tags(dir.path()), (std::vector<std::string>{"real", "second"}));
  EXPECT_TRUE(path_exists(dir.file("notes.txt")));
}

TEST(ListingTest, ADataFileNamedByTheManifestMustExistWithItsSize) {
  TempDir dir;
  TestState s;
  s.add("w", "F32", {8}, 1);
  FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir.path(), small_options()));
  FP_ASSERT_OK(mgr->save("x", s.content()));
  FP_ASSERT_OK(mgr->save("y", s.content()));
  // An extra byte at the end of a data file is damage too (a replaced file).
  write_text(dir.file("x/objects.pkl"), "replaced");
  std::vector<std::string> skipped;
  FP_ASSERT_OK_AND_ASSIGN(auto listed, list_checkpoints(dir.path(), &skipped));
  EXPECT_EQ(tags_of(listed), (std::vector<std::string>{"y"}));
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("objects.pkl"), std::string::npos) << skipped[0];
}

}  // namespace
}  // namespace fastpersist::testing
