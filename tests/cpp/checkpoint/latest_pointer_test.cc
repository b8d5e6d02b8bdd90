// SPDX-License-Identifier: Apache-2.0
// latest_checkpoint is the newest committed checkpoint by commit order, whatever <root>/latest
// says (missing, garbage, older, removed, damaged); a manager opening the root repairs a stale
// pointer file for other tools, and a manager removing the checkpoint it names repoints it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_test_util.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace fastpersist::testing {
namespace {

class LatestPointerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TestState s;
    s.add("w", "F32", {16}, 1);
    FP_ASSERT_OK_AND_ASSIGN(mgr_, CheckpointManager::open(dir_.path(), small_options()));
    for (const char* tag : {"a", "c", "b"}) FP_ASSERT_OK(mgr_->save(tag, s.content()));
    pointer_ = dir_.file("latest");
  }
  std::optional<std::string> latest() {
    auto r = latest_checkpoint(dir_.path());
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? *r : std::optional<std::string>("<error>");
  }
  TempDir dir_;
  std::unique_ptr<CheckpointManager> mgr_;
  std::string pointer_;
};

TEST_F(LatestPointerTest, NamesTheLastCommitted) {
  EXPECT_EQ(read_text(pointer_), "b\n");
  EXPECT_EQ(latest(), "b");
}

TEST_F(LatestPointerTest, AnswerIsTheNewestCommittedWhateverThePointerSays) {
  write_text(pointer_, "a\n");  // an older one (a crash between commit and pointer update)
  EXPECT_EQ(latest(), "b");
  write_text(pointer_, "zzz\n");  // never saved
  EXPECT_EQ(latest(), "b");
  write_text(pointer_, "");
  EXPECT_EQ(latest(), "b");
  write_text(pointer_, "../a\n");
  EXPECT_EQ(latest(), "b");
  write_text(pointer_, std::string(10000, 'x'));
  EXPECT_EQ(latest(), "b");
  ASSERT_EQ(::unlink(pointer_.c_str()), 0);
  EXPECT_EQ(latest(), "b");
}

TEST_F(LatestPointerTest, TheNextManagerRepairsAStalePointer) {
  FP_ASSERT_OK(mgr_->close());
  for (const char* stale : {"a\n", "zzz", ""}) {
    write_text(pointer_, stale);
    FP_ASSERT_OK_AND_ASSIGN(auto again, CheckpointManager::open(dir_.path(), small_options()));
    EXPECT_EQ(read_text(pointer_), "b\n") << "stale pointer '" << stale << "'";
  }
  ASSERT_EQ(::unlink(pointer_.c_str()), 0);
  FP_ASSERT_OK_AND_ASSIGN(auto again, CheckpointManager::open(dir_.path(), small_options()));
  EXPECT_EQ(read_text(pointer_), "b\n");
}

// A root that another tool also writes (DeepSpeed's own engine saving tags next to ours): its
// newest tag is a directory without a manifest, and the pointer naming it is not stale.
TEST_F(LatestPointerTest, APointerToAForeignCheckpointStays) {
  FP_ASSERT_OK(mgr_->close());
  std::filesystem::create_directory(dir_.file("global_step9"));
  write_text(dir_.file("global_step9") + "/mp_rank_00_model_states.pt", "not ours");
  write_text(pointer_, "global_step9");
  FP_ASSERT_OK_AND_ASSIGN(auto again, CheckpointManager::open(dir_.path(), small_options()));
  EXPECT_EQ(read_text(pointer_), "global_step9");
  EXPECT_EQ(latest(), "b");  // the newest committed checkpoint of ours
  FP_ASSERT_OK(again->close());
  // A pointer naming a plain file, or a path out of the root, is still repaired.
  for (const char* stale : {"latest", "../x"}) {
    write_text(pointer_, stale);
    FP_ASSERT_OK_AND_ASSIGN(auto third, CheckpointManager::open(dir_.path(), small_options()));
    EXPECT_EQ(read_text(pointer_), "b\n") << stale;
  }
}

// Regression (issue 10): removing the newest checkpoint left `latest` naming the deleted
// directory until the next open.
TEST_F(LatestPointerTest, RemovingTheNewestPointsLatestAtTheNewestRemaining) {
  FP_ASSERT_OK(mgr_->remove("b"));
  EXPECT_EQ(read_text(pointer_), "c\n");
  EXPECT_EQ(latest(), "c");
  FP_ASSERT_OK(mgr_->remove("c"));
  EXPECT_EQ(read_text(pointer_), "a\n");
}

TEST_F(LatestPointerTest, RemovingAnOlderOneLeavesThePointerAsItIs) {
  FP_ASSERT_OK(mgr_->remove("a"));
  EXPECT_EQ(read_text(pointer_), "b\n");
  FP_ASSERT_OK(mgr_->remove("c"));
  EXPECT_EQ(read_text(pointer_), "b\n");
}

TEST_F(LatestPointerTest, RemovingTheLastCheckpointRemovesThePointer) {
  for (const char* tag : {"a", "b", "c"}) FP_ASSERT_OK(mgr_->remove(tag));
  EXPECT_FALSE(std::filesystem::exists(pointer_));
  EXPECT_EQ(latest(), std::nullopt);
  // The next save points it again.
  TestState s;
  s.add("w", "F32", {4}, 2);
  FP_ASSERT_OK(mgr_->save("d", s.content()));
  EXPECT_EQ(read_text(pointer_), "d\n");
}

// prune() never removes the newest checkpoint, so it can remove the one `latest` names only
// when the pointer lags (written here by hand, as a crash would leave it).
TEST_F(LatestPointerTest, PruneRemovingTheCheckpointALaggingPointerNamesRepointsIt) {
  write_text(pointer_, "a\n");
  FP_ASSERT_OK_AND_ASSIGN(std::vector<std::string> removed,
                          mgr_->prune(1, std::nullopt, false, nullptr));
  EXPECT_EQ(removed, (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(read_text(pointer_), "b\n");
}

TEST_F(LatestPointerTest, RemovalsRacingSavesNeverPointBackPastACommit) {
  TestState s;
  s.add("w", "F32", {16}, 3);
  // Saves commit on the manager's thread while this thread removes older checkpoints: the
  // pointer must end on the last save, never on a checkpoint committed before it.
  for (int i = 0; i < 20; ++i) {
    std::string tag = "s" + std::to_string(100 + i);
    FP_ASSERT_OK_AND_ASSIGN(PendingSave pending, mgr_->save_async(tag, s.content()));
    if (i > 0) FP_ASSERT_OK(mgr_->remove("s" + std::to_string(100 + i - 1)));
    FP_ASSERT_OK(pending.wait());
    EXPECT_EQ(read_text(pointer_), tag + "\n");
  }
}

TEST_F(LatestPointerTest, PointerToADamagedCheckpoint) {
  write_text(dir_.file("b/manifest.json"), "not json");
  EXPECT_EQ(latest(), "c");
  ASSERT_EQ(::unlink(dir_.file("c/manifest.json").c_str()), 0);
  EXPECT_EQ(latest(), "a");
}

TEST(LatestCheckpointTest, EmptyAndMissingRoots) {
  TempDir dir;
  FP_ASSERT_OK_AND_ASSIGN(auto none, latest_checkpoint(dir.path()));
  EXPECT_EQ(none, std::nullopt);
  write_text(dir.file("latest"), "ghost\n");
  FP_ASSERT_OK_AND_ASSIGN(none, latest_checkpoint(dir.path()));
  EXPECT_EQ(none, std::nullopt);
  auto missing = latest_checkpoint(dir.file("no-such-root"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status().to_string();
  EXPECT_EQ(list_checkpoints(dir.file("no-such-root")).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace fastpersist::testing
