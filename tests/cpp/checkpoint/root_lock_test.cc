// SPDX-License-Identifier: Apache-2.0
// One writer per root: a second manager is refused (kBusy naming the holder's pid) until the
// first closes; opening a root removes the debris of crashed saves and nothing else.
#include "checkpoint/root_lock.h"

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

TEST(RootLockTest, SecondManagerIsBusyUntilTheFirstCloses) {
  TempDir dir;
  FP_ASSERT_OK_AND_ASSIGN(auto first, CheckpointManager::open(dir.path(), small_options()));
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto second = CheckpointManager::open(dir.path(), small_options());
    ASSERT_FALSE(second.is_ok());
    EXPECT_EQ(second.status().code(), StatusCode::kBusy) << second.status().to_string();
    EXPECT_NE(second.status().message().find("pid " + std::to_string(::getpid())),
              std::string::npos)
        << second.status().to_string();
  }
  // The refused open did not disturb the holder.
  TestState s;
  s.add("w", "F32", {8}, 1);
  FP_ASSERT_OK(first->save("a", s.content()));

  FP_ASSERT_OK(first->close());
  FP_ASSERT_OK_AND_ASSIGN(auto third, CheckpointManager::open(dir.path(), small_options()));
  FP_ASSERT_OK(third->save("b", s.content()));
  EXPECT_EQ(listed_tags(dir.path()), (std::vector<std::string>{"a", "b"}));
  third.reset();  // the destructor releases the lock too
  FP_ASSERT_OK_AND_ASSIGN(auto fourth, CheckpointManager::open(dir.path(), small_options()));
}

TEST(RootLockTest, LockObjectDirectly) {
  TempDir dir;
  FP_ASSERT_OK_AND_ASSIGN(checkpoint::RootLock a, checkpoint::RootLock::acquire(dir.path()));
  EXPECT_TRUE(a.held());
  auto b = checkpoint::RootLock::acquire(dir.path());
  EXPECT_EQ(b.status().code(), StatusCode::kBusy);
  a.release();
  EXPECT_FALSE(a.held());
  FP_ASSERT_OK_AND_ASSIGN(checkpoint::RootLock c, checkpoint::RootLock::acquire(dir.path()));
  EXPECT_TRUE(c.held());
  EXPECT_EQ(checkpoint::RootLock::acquire(dir.file("missing/dir")).status().code(),
            StatusCode::kNotFound);
}

TEST(RootLockTest, OpenRemovesDebrisAndNothingElse) {
  TempDir dir;
  TestState s;
  s.add("w", "F32", {8}, 1);
  {
    FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir.path(), small_options()));
    FP_ASSERT_OK(mgr->save("kept", s.content()));
  }
  // What crashed saves and removals leave behind.
  ASSERT_EQ(::mkdir(dir.file(".tmp-x").c_str(), 0755), 0);
  write_text(dir.file(".tmp-x/tensors-00000-of-00001.safetensors"), "partial");
  ASSERT_EQ(::mkdir(dir.file(".trash-y").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(dir.file(".trash-y/sub").c_str(), 0755), 0);
  write_text(dir.file(".trash-y/sub/file"), "half removed");
  write_text(dir.file(".latest.tmp-123-0-abc"), "kept\n");
  // What is not debris.
  ASSERT_EQ(::mkdir(dir.file("user-folder").c_str(), 0755), 0);
  write_text(dir.file("user-folder/notes.txt"), "mine");
  write_text(dir.file(".hidden-user-file"), "mine");

  FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir.path(), small_options()));
  EXPECT_FALSE(path_exists(dir.file(".tmp-x")));
  EXPECT_FALSE(path_exists(dir.file(".trash-y")));
  EXPECT_FALSE(path_exists(dir.file(".latest.tmp-123-0-abc")));
  EXPECT_TRUE(path_exists(dir.file("user-folder/notes.txt")));
  EXPECT_TRUE(path_exists(dir.file(".hidden-user-file")));
  EXPECT_EQ(read_text(dir.file("latest")), "kept\n");
  std::vector<std::string> skipped;
  FP_ASSERT_OK_AND_ASSIGN(auto listed, list_checkpoints(dir.path(), &skipped));
  EXPECT_EQ(tags_of(listed), (std::vector<std::string>{"kept"}));
  EXPECT_TRUE(skipped.empty()) << joined(skipped);  // a folder without a manifest is not damage
  expect_checkpoint_matches(dir.file("kept"), s);
}

TEST(RootLockTest, DebrisIsLeftAloneWhileAnotherManagerHoldsTheLock) {
  TempDir dir;
  FP_ASSERT_OK_AND_ASSIGN(auto holder, CheckpointManager::open(dir.path(), small_options()));
  ASSERT_EQ(::mkdir(dir.file(".tmp-in-progress").c_str(), 0755), 0);
  auto second = CheckpointManager::open(dir.path(), small_options());
  EXPECT_EQ(second.status().code(), StatusCode::kBusy);
  EXPECT_TRUE(path_exists(dir.file(".tmp-in-progress"))) << "a refused manager must not clean";
}

TEST(RootLockTest, OpenCreatesTheRoot) {
  TempDir dir;
  FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir.file("new-root"), small_options()));
  EXPECT_TRUE(path_exists(dir.file("new-root/.lock")));
  EXPECT_EQ(mgr->root(), dir.file("new-root"));
  EXPECT_EQ(mgr->options().max_parallel_files, 3u);
  FP_ASSERT_OK_AND_ASSIGN(auto infos, mgr->list());
  EXPECT_TRUE(infos.empty());
  FP_ASSERT_OK_AND_ASSIGN(auto latest, latest_checkpoint(dir.file("new-root")));
  EXPECT_EQ(latest, std::nullopt);
}

}  // namespace
}  // namespace fastpersist::testing
