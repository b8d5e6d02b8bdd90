// SPDX-License-Identifier: Apache-2.0
// Retention: keep_last / keep_every applied after each commit and by prune(); the newest
// checkpoint is never removed; remove() of a tag and of an unknown tag.
#include "checkpoint/retention.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "checkpoint/checkpoint_test_util.h"
#include "checkpoint/root_scan.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/manifest.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace fastpersist::testing {
namespace {

using Tags = std::vector<std::string>;

// Marks a directory immutable (chattr +i) while alive, so nothing can rename or remove it: a
// real failure of retention. Needs CAP_LINUX_IMMUTABLE and a filesystem with the flag (ext4,
// xfs); ok() is false elsewhere.
class ImmutableDir {
 public:
  explicit ImmutableDir(const std::string& path)
      : fd_(::open(path.c_str(), O_RDONLY | O_DIRECTORY)) {
    if (fd_ >= 0 && set(true)) ok_ = true;
  }
  ~ImmutableDir() {
    if (ok_) set(false);
    if (fd_ >= 0) ::close(fd_);
  }
  ImmutableDir(const ImmutableDir&) = delete;
  ImmutableDir& operator=(const ImmutableDir&) = delete;
  bool ok() const { return ok_; }

 private:
  bool set(bool on) {
    int flags = 0;
    if (::ioctl(fd_, FS_IOC_GETFLAGS, &flags) != 0) return false;
    flags = on ? (flags | FS_IMMUTABLE_FL) : (flags & ~FS_IMMUTABLE_FL);
    return ::ioctl(fd_, FS_IOC_SETFLAGS, &flags) == 0;
  }
  int fd_;
  bool ok_ = false;
};

TestState tiny_state(int64_t step) {
  TestState s;
  s.add("w", "F32", {64}, static_cast<uint64_t>(step));
  s.step = step;
  return s;
}

class RetentionTest : public ::testing::Test {
 protected:
  void save_steps(CheckpointManager& mgr, int64_t from, int64_t to) {
    for (int64_t step = from; step <= to; ++step) {
      TestState s = tiny_state(step);
      Status st = mgr.save("step-" + std::to_string(step), s.content());
      ASSERT_TRUE(st.is_ok()) << st.to_string();
    }
  }
  void expect_no_debris() {
    EXPECT_TRUE(names_with_prefix(dir_.path(), ".trash-").empty());
    EXPECT_TRUE(names_with_prefix(dir_.path(), ".tmp-").empty());
  }
  TempDir dir_;
};

TEST_F(RetentionTest, KeepLastKeepsTheNewest) {
  CheckpointOptions o = small_options();
  o.keep_last = 2;
  FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir_.path(), o));
  save_steps(*mgr, 1, 5);
  EXPECT_EQ(listed_tags(dir_.path()), (Tags{"step-4", "step-5"}));
  EXPECT_FALSE(path_exists(dir_.file("step-1")));
  expect_no_debris();
  FP_ASSERT_OK_AND_ASSIGN(auto latest, latest_checkpoint(dir_.path()));
  EXPECT_EQ(latest, std::optional<std::string>("step-5"));
  expect_checkpoint_matches(dir_.file("step-4"), tiny_state(4));
}

// Retention runs after the commit: when it cannot remove an old checkpoint the save still
// succeeds (it is committed), retention_status() says what was left, and the next save's
// retention removes it once it can.
TEST_F(RetentionTest, FailedRetentionDoesNotFailTheCommittedSave) {
  CheckpointOptions o = small_options();
  o.keep_last = 1;
  FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir_.path(), o));
  save_steps(*mgr, 1, 1);
  {
    ImmutableDir pinned(dir_.file("step-1"));
    if (!pinned.ok())
      GTEST_SKIP() << "cannot set the immutable flag here (needs root and ext4/xfs)";
    TestState s = tiny_state(2);
    FP_ASSERT_OK_AND_ASSIGN(PendingSave p, mgr->save_async("step-2", s.content()));
    FP_EXPECT_OK(p.wait());
    Status retention = p.retention_status();
    EXPECT_FALSE(retention.is_ok());
    EXPECT_NE(retention.message().find("'step-2' is committed"), std::string::npos)
        << retention.to_string();
    EXPECT_NE(retention.message().find("step-1"), std::string::npos) << retention.to_string();
    EXPECT_EQ(listed_tags(dir_.path()), (Tags{"step-1", "step-2"}));
    FP_ASSERT_OK_AND_ASSIGN(auto latest, latest_checkpoint(dir_.path()));
    EXPECT_EQ(latest, std::optional<std::string>("step-2"));
    expect_checkpoint_matches(dir_.file("step-2"), tiny_state(2));
  }
  FP_EXPECT_OK(mgr->wait_all());  // a retention failure is not a save failure
  TestState s = tiny_state(3);
  FP_ASSERT_OK_AND_ASSIGN(PendingSave p, mgr->save_async("step-3", s.content()));
  FP_EXPECT_OK(p.wait());
  FP_EXPECT_OK(p.retention_status());
  EXPECT_EQ(listed_tags(dir_.path()), (Tags{"step-3"}));
  expect_no_debris();
}

// A verified prune reads the checkpoints it would keep: bit rot in the newest one must not
// make it delete the last intact one. Unverified, the listing's cheap checks pass and the
// intact one goes.
TEST_F(RetentionTest, VerifiedPruneKeepsTheNewestIntactCheckpoint) {
  CheckpointOptions o = small_options();
  FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir_.path(), o));
  save_steps(*mgr, 1, 4);
  FP_ASSERT_OK_AND_ASSIGN(Manifest m, read_manifest(dir_.file("step-4")));
  const ManifestTensor& t = m.tensors.front();
  flip_byte(dir_.file("step-4") + "/" + t.file, t.offset + t.length / 2);

  std::vector<std::string> damaged;
  FP_ASSERT_OK_AND_ASSIGN(auto removed, mgr->prune(1, std::nullopt, /*verify=*/true, &damaged));
  EXPECT_EQ(removed, (Tags{"step-1", "step-2"}));
  ASSERT_EQ(damaged.size(), 1u);
  EXPECT_EQ(damaged[0].rfind("step-4: ", 0), 0u) << damaged[0];
  EXPECT_NE(damaged[0].find("'w'"), std::string::npos) << damaged[0];
  EXPECT_EQ(listed_tags(dir_.path()), (Tags{"step-3", "step-4"}));  // the damaged one is newest

  FP_ASSERT_OK_AND_ASSIGN(removed, mgr->prune(1, std::nullopt));  // unverified
  EXPECT_EQ(removed, (Tags{"step-3"}));
  EXPECT_EQ(listed_tags(dir_.path()), (Tags{"step-4"}));
  expect_no_debris();
}

TEST(DemoteDamagedTest, ChecksNewestFirstUntilEnoughAreIntact) {
  checkpoint::RootScan scan;
  for (uint64_t seq = 1; seq <= 6; ++seq) {
    scan.committed.push_back(
        {"t" + std::to_string(seq), static_cast<int64_t>(seq), seq, 0, 0, 0, 0, 0});
  }
  std::vector<std::string> checked;
  auto found = checkpoint::demote_damaged(&scan, 2, [&](const CheckpointInfo& c) {
    checked.push_back(c.tag);
    return (c.tag == "t6" || c.tag == "t4") ? std::string("bad bytes") : std::string();
  });
  EXPECT_EQ(checked, (Tags{"t6", "t5", "t4", "t3"}));  // t2 and t1 are not read
  EXPECT_EQ(found, (Tags{"t6: bad bytes", "t4: bad bytes"}));
  std::vector<std::string> committed;
  for (const CheckpointInfo& c : scan.committed) committed.push_back(c.tag);
  EXPECT_EQ(committed, (Tags{"t1", "t2", "t3", "t5"}));
  ASSERT_EQ(scan.damaged.size(), 2u);
  EXPECT_EQ(scan.damaged[0].sequence, std::optional<uint64_t>(6));
  // keep_last 2: t3 and t5 stay; t4 (damaged, only t5 intact and newer) and t6 (damaged,
  // newest) stay; t1 and t2 go.
  EXPECT_EQ(checkpoint::select_all_for_removal(scan, 2, std::nullopt), (Tags{"t1", "t2"}));
}

TEST_F(RetentionTest, KeepEveryKeepsMilestones) {
  CheckpointOptions o = small_options();
  o.keep_last = 1;
  o.keep_every = 2;
  FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir_.path(), o));
  save_steps(*mgr, 1, 5);
  EXPECT_EQ(listed_tags(dir_.path()), (Tags{"step-2", "step-4", "step-5"}));
  save_steps(*mgr, 6, 7);
  EXPECT_EQ(listed_tags(dir_.path()), (Tags{"step-2", "step-4", "step-6", "step-7"}));
  expect_no_debris();
}

TEST_F(RetentionTest, KeepLastZeroStillKeepsTheNewest) {
  // As a setting it is a mistake, refused (CheckpointOptions::validate, as the Python package
  // and a tier refuse it); prune(0) keeps the newest, as prune(1) does.
  CheckpointOptions o = small_options();
  o.keep_last = 0;
  EXPECT_EQ(CheckpointManager::open(dir_.path(), o).status().code(), StatusCode::kInvalidArgument);
  FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir_.path(), small_options()));
  save_steps(*mgr, 1, 3);
  FP_ASSERT_OK_AND_ASSIGN(auto removed, mgr->prune(0, std::nullopt));
  EXPECT_EQ(removed, (Tags{"step-1", "step-2"}));
  EXPECT_EQ(listed_tags(dir_.path()), (Tags{"step-3"}));
}

TEST_F(RetentionTest, KeepEveryAloneRemovesNothing) {
  CheckpointOptions o = small_options();
  o.keep_every = 2;
  FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir_.path(), o));
  save_steps(*mgr, 1, 3);
  EXPECT_EQ(listed_tags(dir_.path()).size(), 3u);
}

TEST_F(RetentionTest, PruneAppliesAPolicyNow) {
  FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir_.path(), small_options()));
  save_steps(*mgr, 1, 6);
  FP_ASSERT_OK_AND_ASSIGN(auto none, mgr->prune(std::nullopt, std::nullopt));
  EXPECT_TRUE(none.empty());
  FP_ASSERT_OK_AND_ASSIGN(auto removed, mgr->prune(4, 3));
  EXPECT_EQ(removed, (Tags{"step-1", "step-2"}));
  EXPECT_EQ(listed_tags(dir_.path()), (Tags{"step-3", "step-4", "step-5", "step-6"}));
  FP_ASSERT_OK_AND_ASSIGN(removed, mgr->prune(0, std::nullopt));
  EXPECT_EQ(removed, (Tags{"step-3", "step-4", "step-5"}));
  EXPECT_EQ(listed_tags(dir_.path()), (Tags{"step-6"}));
  expect_no_debris();
}

TEST_F(RetentionTest, ASaveWhoseCommitIsUndoneNeverCostsAnOlderCheckpoint) {
  // Every save after step-2 is renamed into place and then undone: the 'latest' pointer cannot
  // be written (a directory holds its name). A prune() racing with them must not count such a
  // save among the newest, or it removes step-1 for a checkpoint that then does not exist.
  FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir_.path(), small_options()));
  save_steps(*mgr, 1, 2);
  ASSERT_EQ(::unlink(dir_.file("latest").c_str()), 0);
  ASSERT_EQ(::mkdir(dir_.file("latest").c_str(), 0755), 0);
  write_text(dir_.file("latest") + "/keeps-it-non-empty", "x");
  std::atomic<bool> saving{true};
  std::atomic<int> prunes{0};
  std::vector<std::string> wrongly_removed;
  std::thread pruner([&] {
    while (saving.load()) {
      auto removed = mgr->prune(2, std::nullopt);
      if (removed.is_ok())
        wrongly_removed.insert(wrongly_removed.end(), removed->begin(), removed->end());
      ++prunes;
    }
  });
  int undone = 0;
  for (int i = 0; i < 300; ++i) {
    TestState s = tiny_state(100 + i);
    Status st = mgr->save("undone-" + std::to_string(i), s.content());
    undone += !st.is_ok() && st.message().find("was therefore not kept") != std::string::npos;
  }
  saving = false;
  pruner.join();
  EXPECT_EQ(undone, 300) << "every save is undone";
  EXPECT_GT(prunes.load(), 0);
  EXPECT_TRUE(wrongly_removed.empty())
      << wrongly_removed.size() << " removed, first " << wrongly_removed[0];
  EXPECT_EQ(listed_tags(dir_.path()), (Tags{"step-1", "step-2"}));
}

// Damage a checkpoint the way a lost or truncated file does: its manifest still decodes.
void lose_a_data_file(const std::string& dir) {
  auto files = names_with_prefix(dir, "tensors-");
  ASSERT_FALSE(files.empty()) << dir;
  ASSERT_EQ(::unlink((dir + "/" + files[0]).c_str()), 0);
}

TEST_F(RetentionTest, ADamagedCheckpointGoesOnceKeepLastValidOnesAreNewer) {
  CheckpointOptions o = small_options();
  o.keep_last = 2;
  FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir_.path(), o));
  save_steps(*mgr, 1, 3);  // keeps step-2, step-3
  lose_a_data_file(dir_.file("step-3"));
  write_text(dir_.file("step-2/manifest.json"), "{ not json");  // damaged, age unknown
  save_steps(*mgr, 4, 4);
  // Only one valid checkpoint (step-4) is newer than step-3: intact, it would be kept.
  EXPECT_TRUE(path_exists(dir_.file("step-3")));
  save_steps(*mgr, 5, 5);
  // Two valid ones are newer now: step-3 goes; step-2's age is unknown: it stays.
  EXPECT_FALSE(path_exists(dir_.file("step-3")));
  EXPECT_TRUE(path_exists(dir_.file("step-2")));
  EXPECT_EQ(listed_tags(dir_.path()), (Tags{"step-4", "step-5"}));
  expect_no_debris();
}

TEST_F(RetentionTest, PruneRemovesOldDamagedCheckpointsButNotDamagedMilestones) {
  FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir_.path(), small_options()));
  save_steps(*mgr, 1, 6);
  lose_a_data_file(dir_.file("step-1"));
  lose_a_data_file(dir_.file("step-2"));
  lose_a_data_file(dir_.file("step-5"));
  FP_ASSERT_OK_AND_ASSIGN(auto removed, mgr->prune(2, 2));
  // Valid: step-3, step-4, step-6; kept: the newest two and milestones. Damaged: step-1 has
  // three valid ones after it and is no milestone: goes; step-2 is a milestone; step-5 has
  // only step-6 after it.
  EXPECT_EQ(removed, (Tags{"step-3", "step-1"}));
  EXPECT_EQ(listed_tags(dir_.path()), (Tags{"step-4", "step-6"}));
  EXPECT_TRUE(path_exists(dir_.file("step-2")));
  EXPECT_TRUE(path_exists(dir_.file("step-5")));
}

TEST_F(RetentionTest, SequencesStayAboveDamagedAndRemovedCheckpoints) {
  {
    FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir_.path(), small_options()));
    save_steps(*mgr, 1, 3);
    FP_ASSERT_OK(mgr->close());
  }
  lose_a_data_file(dir_.file("step-3"));  // the newest sequence now belongs to a damaged one
  {
    FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir_.path(), small_options()));
    save_steps(*mgr, 4, 4);
    FP_ASSERT_OK(mgr->close());
  }
  FP_ASSERT_OK_AND_ASSIGN(auto listed, list_checkpoints(dir_.path()));
  ASSERT_EQ(tags_of(listed), (Tags{"step-1", "step-2", "step-4"}));
  EXPECT_EQ(listed.back().sequence, 4u) << "not 3, which the damaged step-3 carries";
}

TEST(SelectDamagedForRemovalTest, Policies) {
  checkpoint::RootScan scan;
  for (uint64_t seq : {2, 4, 6, 8}) {
    CheckpointInfo i;
    i.tag = "c" + std::to_string(seq);
    i.sequence = seq;
    i.step = static_cast<int64_t>(seq) * 10;
    scan.committed.push_back(i);
  }
  scan.damaged = {{"old", "", 1, 15},
                  {"mid", "", 5, 55},
                  {"milestone", "", 3, 40},
                  {"unknown", "", std::nullopt, std::nullopt},
                  {"newest", "", 9, 95}};
  using checkpoint::select_damaged_for_removal;
  EXPECT_TRUE(select_damaged_for_removal(scan, std::nullopt, std::nullopt).empty());
  EXPECT_TRUE(select_damaged_for_removal(scan, std::nullopt, 10).empty());
  EXPECT_EQ(select_damaged_for_removal(scan, 2, std::nullopt), (Tags{"old", "mid", "milestone"}));
  EXPECT_EQ(select_damaged_for_removal(scan, 2, 20), (Tags{"old", "mid"}));
  EXPECT_EQ(select_damaged_for_removal(scan, 3, std::nullopt), (Tags{"old", "milestone"}));
  EXPECT_EQ(select_damaged_for_removal(scan, 4, std::nullopt), (Tags{"old"}));
  EXPECT_TRUE(select_damaged_for_removal(scan, 9, std::nullopt).empty());
  EXPECT_EQ(select_damaged_for_removal(scan, 0, std::nullopt), (Tags{"old", "mid", "milestone"}));
  EXPECT_EQ(scan.highest_sequence(), 9u);
  checkpoint::RootScan no_committed;
  no_committed.damaged = scan.damaged;
  EXPECT_TRUE(select_damaged_for_removal(no_committed, 1, std::nullopt).empty());
}

TEST(DecideRetentionTest, KeepsWhatKeptCheckpointsReferenceAndSaysWhy) {
  checkpoint::RootScan scan;
  auto add = [&](const std::string& tag, uint64_t seq, std::vector<std::string> refs) {
    CheckpointInfo i;
    i.tag = tag;
    i.sequence = seq;
    i.step = static_cast<int64_t>(seq) * 100;
    i.references = std::move(refs);
    scan.committed.push_back(i);
  };
  add("f1", 1, {});
  add("i2", 2, {"f1"});
  add("f3", 3, {});
  add("i4", 4, {"f3"});
  add("i5", 5, {"f3"});
  // keep_last 2 keeps i4 and i5, and their base f3; f1 and i2 go (i2 is not kept, so neither
  // is its base).
  checkpoint::RetentionDecision d = checkpoint::decide_retention(scan, 2, std::nullopt);
  EXPECT_EQ(d.remove, (Tags{"i2", "f1"}));  // an incremental checkpoint before its base
  ASSERT_EQ(d.kept.size(), 3u);
  EXPECT_EQ(d.kept[0].first, "f3");
  EXPECT_EQ(d.kept[0].second, "the base of i4, i5 (incremental, kept)");
  EXPECT_EQ(d.kept[1].second, "one of the newest 2");
  EXPECT_EQ(d.kept[2].second, "the newest");
  // A milestone that is incremental keeps its base too, with both reasons where they apply.
  d = checkpoint::decide_retention(scan, 1, 200);  // milestones: i2 (step 200), i4 (400)
  EXPECT_TRUE(d.remove.empty());
  ASSERT_EQ(d.kept.size(), 5u);
  EXPECT_EQ(d.kept[0].second, "the base of i2 (incremental, kept)");
  EXPECT_EQ(d.kept[1].second, "a milestone (step 200 is a multiple of 200)");
  EXPECT_EQ(d.kept[2].second, "the base of i4, i5 (incremental, kept)");
  EXPECT_EQ(d.kept[3].second, "a milestone (step 400 is a multiple of 200)");
  EXPECT_EQ(d.kept[4].second, "the newest");
  d = checkpoint::decide_retention(scan, 1, 500);  // i5 is the newest and a milestone
  EXPECT_EQ(d.remove, (Tags{"i2", "i4", "f1"}));
  EXPECT_EQ(d.kept[1].second, "the newest; a milestone (step 500 is a multiple of 500)");
  // A damaged checkpoint that is kept (too new to go) keeps its base as well.
  scan.damaged.push_back({"d6", "broken", 6, 600, {"f1"}});
  d = checkpoint::decide_retention(scan, 1, std::nullopt);
  EXPECT_EQ(d.remove, (Tags{"i2", "i4"}));
  EXPECT_EQ(d.kept[0].second, "the base of d6 (incremental, kept)");
  // No policy: everything stays, and the reasons say so.
  d = checkpoint::decide_retention(scan, std::nullopt, std::nullopt);
  EXPECT_TRUE(d.remove.empty());
  EXPECT_EQ(d.kept[0].second, "no keep-last policy; the base of i2, d6 (incremental, kept)");
}

TEST_F(RetentionTest, RemoveATagAndAnUnknownOne) {
  FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir_.path(), small_options()));
  save_steps(*mgr, 1, 3);
  FP_ASSERT_OK(mgr->remove("step-2"));
  EXPECT_EQ(listed_tags(dir_.path()), (Tags{"step-1", "step-3"}));
  EXPECT_FALSE(path_exists(dir_.file("step-2")));
  expect_no_debris();

  Status st = mgr->remove("step-2");
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.to_string();
  st = mgr->remove("never-saved");
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.to_string();
  EXPECT_NE(st.message().find("never-saved"), std::string::npos);
  EXPECT_EQ(mgr->remove("../outside").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(mgr->remove("latest").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(mgr->remove("").code(), StatusCode::kInvalidArgument);
  // The lock file and the pointer are untouched.
  EXPECT_TRUE(path_exists(dir_.file(".lock")));
  EXPECT_EQ(read_text(dir_.file("latest")), "step-3\n");

  // Removing the newest: latest falls back to what is left.
  FP_ASSERT_OK(mgr->remove("step-3"));
  FP_ASSERT_OK_AND_ASSIGN(auto latest, latest_checkpoint(dir_.path()));
  EXPECT_EQ(latest, std::optional<std::string>("step-1"));
}

TEST(SelectForRemovalTest, Policies) {
  auto info = [](const std::string& tag, std::optional<int64_t> step, uint64_t seq) {
    CheckpointInfo i;
    i.tag = tag;
    i.step = step;
    i.sequence = seq;
    return i;
  };
  std::vector<CheckpointInfo> all = {info("a", 10, 1), info("b", 20, 2), info("c", std::nullopt, 3),
                                     info("d", 40, 4), info("e", 50, 5)};
  using checkpoint::select_for_removal;
  EXPECT_TRUE(select_for_removal(all, std::nullopt, std::nullopt).empty());
  EXPECT_TRUE(select_for_removal(all, std::nullopt, 20).empty());
  EXPECT_TRUE(select_for_removal({}, 1, std::nullopt).empty());
  EXPECT_TRUE(select_for_removal(all, 5, std::nullopt).empty());
  EXPECT_TRUE(select_for_removal(all, 9, std::nullopt).empty());
  EXPECT_EQ(select_for_removal(all, 2, std::nullopt), (Tags{"a", "b", "c"}));
  EXPECT_EQ(select_for_removal(all, 0, std::nullopt), (Tags{"a", "b", "c", "d"}));
  EXPECT_EQ(select_for_removal(all, 1, 20), (Tags{"a", "c"}));  // no step: never a milestone
  EXPECT_EQ(select_for_removal(all, 1, 0), (Tags{"a", "b", "c", "d"}));  // K <= 0 ignored
  EXPECT_EQ(select_for_removal(all, 1, -10), (Tags{"a", "b", "c", "d"}));
}

}  // namespace
}  // namespace fastpersist::testing
