// SPDX-License-Identifier: Apache-2.0
// Asynchronous saves: save_async returns a PendingSave; once its snapshot is done the caller may
// change the source memory without changing the checkpoint; max_in_flight bounds the queue;
// tags are unique among committed and pending saves.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "checkpoint/checkpoint_test_util.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"
#include "testing/watchdog.h"

namespace fastpersist::testing {
namespace {

using std::chrono::seconds;

void scribble(TestState& state) {
  for (OwnedTensor& t : state.tensors) std::fill(t.bytes.begin(), t.bytes.end(), std::byte{0xEE});
}

class AsyncSaveTest : public ::testing::TestWithParam<size_t> {
 protected:
  // GetParam(): the staging budget in windows (0 = unbounded).
  CheckpointOptions options() const {
    CheckpointOptions o = small_options();
    o.staging_budget_bytes = GetParam() * o.staging_window_bytes;
    return o;
  }
  std::string root() const { return dir_.file("ckpts"); }
  TempDir dir_;
};

TEST_P(AsyncSaveTest, SourceMayChangeAfterTheSnapshot) {
  run_with_watchdog(seconds(60), "async save, then modify the source", [&] {
    TestState state = mixed_state(31);
    const TestState original = state;
    FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(root(), options()));
    FP_ASSERT_OK_AND_ASSIGN(PendingSave p, mgr->save_async("s1", state.content()));
    EXPECT_EQ(p.tag(), "s1");
    FP_ASSERT_OK(p.wait_snapshot());
    EXPECT_TRUE(p.snapshot_done());
    scribble(state);  // the training step overwrites the weights
    FP_ASSERT_OK(p.wait());
    EXPECT_TRUE(p.done());
    expect_checkpoint_matches(root() + "/s1", original);

    // The same through wait_snapshots() of the manager, with two saves queued.
    TestState second = mixed_state(32);
    const TestState second_original = second;
    CheckpointManager& m = *mgr;
    FP_ASSERT_OK_AND_ASSIGN(PendingSave q, m.save_async("s2", second.content()));
    FP_ASSERT_OK(m.wait_snapshots());
    EXPECT_TRUE(q.snapshot_done());
    scribble(second);
    FP_ASSERT_OK(m.wait_all());
    EXPECT_TRUE(q.done());
    FP_ASSERT_OK(q.wait());
    expect_checkpoint_matches(root() + "/s2", second_original);
    FP_ASSERT_OK(mgr->close());
  });
}

TEST_P(AsyncSaveTest, MaxInFlightOneQueuesTheNextSave) {
  run_with_watchdog(seconds(60), "queued saves", [&] {
    TestState state = mixed_state(33);
    CheckpointOptions o = options();
    o.max_in_flight = 1;
    FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(root(), o));
    std::vector<PendingSave> saves;
    for (int i = 0; i < 4; ++i) {
      FP_ASSERT_OK_AND_ASSIGN(PendingSave p,
                              mgr->save_async("q" + std::to_string(i), state.content()));
      // One in flight at most: the previous save finished before this one was accepted.
      if (!saves.empty()) {
        EXPECT_TRUE(saves.back().done());
      }
      saves.push_back(p);
    }
    for (PendingSave& p : saves) FP_EXPECT_OK(p.wait());
    EXPECT_EQ(listed_tags(root()), (std::vector<std::string>{"q0", "q1", "q2", "q3"}));
  });
}

TEST_P(AsyncSaveTest, SeveralInFlightCommitInOrder) {
  run_with_watchdog(seconds(60), "several saves in flight", [&] {
    std::vector<TestState> states;
    for (int i = 0; i < 5; ++i) states.push_back(mixed_state(40 + static_cast<uint64_t>(i)));
    CheckpointOptions o = options();
    o.max_in_flight = 3;
    FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(root(), o));
    std::vector<PendingSave> saves;
    for (int i = 0; i < 5; ++i) {
      FP_ASSERT_OK_AND_ASSIGN(PendingSave p,
                              mgr->save_async("p" + std::to_string(i), states[i].content()));
      saves.push_back(p);
    }
    FP_ASSERT_OK(mgr->wait_all());
    for (PendingSave& p : saves) {
      EXPECT_TRUE(p.done());
      FP_EXPECT_OK(p.wait());
    }
    EXPECT_EQ(listed_tags(root()), (std::vector<std::string>{"p0", "p1", "p2", "p3", "p4"}));
    for (int i = 0; i < 5; ++i)
      expect_checkpoint_matches(root() + "/p" + std::to_string(i), states[i]);
    FP_ASSERT_OK_AND_ASSIGN(auto latest, latest_checkpoint(root()));
    EXPECT_EQ(latest, std::optional<std::string>("p4"));
  });
}

TEST_P(AsyncSaveTest, TagsAreUniqueAmongCommittedAndPendingSaves) {
  run_with_watchdog(seconds(60), "duplicate tags", [&] {
    TestState state = mixed_state(34);
    CheckpointOptions o = options();
    o.max_in_flight = 2;
    FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(root(), o));
    FP_ASSERT_OK(mgr->save("done", state.content()));
    auto again = mgr->save_async("done", state.content());
    EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists) << again.status().to_string();
    EXPECT_NE(again.status().message().find("done"), std::string::npos);

    FP_ASSERT_OK_AND_ASSIGN(PendingSave p, mgr->save_async("pending", state.content()));
    auto twice = mgr->save_async("pending", state.content());  // pending or committed by now
    EXPECT_EQ(twice.status().code(), StatusCode::kAlreadyExists) << twice.status().to_string();
    FP_ASSERT_OK(p.wait());
    // The refused duplicates left the original checkpoints untouched, and no failure pending.
    expect_checkpoint_matches(root() + "/done", state);
    expect_checkpoint_matches(root() + "/pending", state);
    FP_ASSERT_OK(mgr->wait_all());
  });
}

INSTANTIATE_TEST_SUITE_P(Budgets, AsyncSaveTest, ::testing::Values(size_t{0}, size_t{2}),
                         [](const auto& p) {
                           return p.param == 0 ? std::string("Unbounded")
                                               : "Budget" + std::to_string(p.param) + "Windows";
                         });

TEST(AsyncSaveLifecycleTest, CloseFinishesPendingSavesAndRefusesMore) {
  TempDir dir;
  TestState state = mixed_state(35);
  run_with_watchdog(seconds(60), "close with saves pending", [&] {
    CheckpointOptions o = small_options();
    o.max_in_flight = 4;
    FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir.path(), o));
    std::vector<PendingSave> saves;
    for (int i = 0; i < 3; ++i) {
      FP_ASSERT_OK_AND_ASSIGN(PendingSave p,
                              mgr->save_async("c" + std::to_string(i), state.content()));
      saves.push_back(p);
    }
    FP_ASSERT_OK(mgr->close());
    for (PendingSave& p : saves) EXPECT_TRUE(p.done());
    EXPECT_EQ(listed_tags(dir.path()).size(), 3u);
    FP_ASSERT_OK(mgr->close());  // idempotent
    auto after = mgr->save_async("late", state.content());
    EXPECT_FALSE(after.is_ok());
    EXPECT_FALSE(mgr->save("late", state.content()).is_ok());
    EXPECT_FALSE(mgr->remove("c0").is_ok());
    EXPECT_FALSE(mgr->prune(1, std::nullopt).is_ok());
    EXPECT_EQ(listed_tags(dir.path()).size(), 3u);
  });
}

TEST(AsyncSaveLifecycleTest, DestructorFinishesPendingSaves) {
  TempDir dir;
  TestState state = mixed_state(36);
  run_with_watchdog(seconds(60), "destroy with saves pending", [&] {
    std::optional<PendingSave> p;
    {
      FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir.path(), small_options()));
      FP_ASSERT_OK_AND_ASSIGN(PendingSave s, mgr->save_async("d", state.content()));
      p = s;
    }
    EXPECT_TRUE(p->done());
    FP_EXPECT_OK(p->wait());
    expect_checkpoint_matches(dir.path() + "/d", state);
  });
}

TEST(AsyncSaveLifecycleTest, RemoveRefusesATagBeingSaved) {
  TempDir dir;
  TestState big;
  big.add("big", "U8", {8 * kMiB}, 3);
  TestState small;
  small.add("w", "F32", {16}, 4);
  run_with_watchdog(seconds(60), "remove while saving", [&] {
    CheckpointOptions o = small_options();
    o.max_in_flight = 2;
    o.staging_budget_bytes = o.staging_window_bytes;  // one window: the big save takes a while
    FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir.path(), o));
    FP_ASSERT_OK_AND_ASSIGN(PendingSave first, mgr->save_async("big", big.content()));
    FP_ASSERT_OK_AND_ASSIGN(PendingSave queued, mgr->save_async("queued", small.content()));
    Status st = mgr->remove("queued");
    // Almost always still queued behind the big save: refused. Should both saves have finished
    // already, the removal is simply allowed.
    if (st.is_ok()) {
      EXPECT_TRUE(queued.done());
    } else {
      EXPECT_EQ(st.code(), StatusCode::kBusy) << st.to_string();
    }
    FP_ASSERT_OK(first.wait());
    FP_ASSERT_OK(queued.wait());
    EXPECT_EQ(path_exists(dir.file("queued")), !st.is_ok());
  });
}

TEST(AsyncSaveLifecycleTest, SaveThenRemoveAtOnceIsNeverBusy) {
  // save() returning means the manager no longer counts the tag as pending.
  TempDir dir;
  TestState state;
  state.add("w", "F32", {1024}, 1);
  run_with_watchdog(seconds(60), "save then remove", [&] {
    FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir.path(), small_options()));
    for (int i = 0; i < 50; ++i) {
      std::string tag = "r" + std::to_string(i);
      FP_ASSERT_OK(mgr->save(tag, state.content()));
      FP_ASSERT_OK(mgr->remove(tag));
      // ... and the same tag may be saved again at once.
      FP_ASSERT_OK(mgr->save(tag, state.content()));
    }
  });
}

}  // namespace
}  // namespace fastpersist::testing
