// SPDX-License-Identifier: Apache-2.0
// Staging memory: with a budget smaller than the state the snapshot streams through the budget
// (never more windows than it allows) and the checkpoint is byte-identical to one staged all at
// once; the pool itself never hands out more windows than its budget, from many threads.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "checkpoint/checkpoint_test_util.h"
#include "checkpoint/pending_save.h"
#include "checkpoint/save_job.h"
#include "checkpoint_dir/checkpoint_fs.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/manifest.h"
#include "fastpersist/shard_writer.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"
#include "testing/watchdog.h"
#include "write/staging_pool.h"

namespace fastpersist::testing {
namespace {

using checkpoint::SaveJob;
using checkpoint::StagingPool;
using std::chrono::seconds;

// A ShardWriter (what the manager saves through) with `o` and the given staging budget.
std::unique_ptr<ShardWriter> make_writer(const CheckpointOptions& o, size_t budget,
                                         std::shared_ptr<IoEngine> engine) {
  ShardWriterOptions wo;
  static_cast<DataFileOptions&>(wo) = o;
  wo.staging_budget_bytes = budget;
  wo.lock_staging_memory = false;
  auto writer = ShardWriter::create(wo, std::move(engine));
  EXPECT_TRUE(writer.is_ok()) << writer.status().to_string();
  return writer.is_ok() ? std::move(writer).value() : nullptr;
}

// Runs one save job with the caller's writer (the manager's is private).
Status run_job(const std::string& root, const std::string& tag, uint64_t sequence,
               const TestState& state, const CheckpointOptions& o, ShardWriter& writer) {
  SaveJob job;
  job.root = root;
  job.tag = tag;
  job.content = state.content();
  FP_ASSIGN_OR_RETURN(job.plan, checkpoint::plan_content(job.content, writer));
  job.sequence = sequence;
  job.state = std::make_shared<PendingSave::State>(tag);
  uint64_t bytes = 0;
  Status st = checkpoint::run_save_job(job, o, writer, &bytes);
  if (st.is_ok()) {
    EXPECT_GT(bytes, state.total_bytes());
    EXPECT_TRUE(PendingSave(job.state).snapshot_done());
  }
  return st;
}

void expect_same_data_files(const std::string& a, const std::string& b) {
  auto ma = read_manifest(a);
  auto mb = read_manifest(b);
  ASSERT_TRUE(ma.is_ok() && mb.is_ok());
  ASSERT_EQ(ma->files.size(), mb->files.size());
  for (size_t i = 0; i < ma->files.size(); ++i) {
    EXPECT_EQ(ma->files[i].name, mb->files[i].name);
    EXPECT_EQ(ma->files[i].checksum, mb->files[i].checksum);
    EXPECT_TRUE(read_text(a + "/" + ma->files[i].name) == read_text(b + "/" + mb->files[i].name))
        << ma->files[i].name << " differs";
  }
  ASSERT_EQ(ma->tensors.size(), mb->tensors.size());
  for (size_t i = 0; i < ma->tensors.size(); ++i) {
    EXPECT_EQ(ma->tensors[i].checksum, mb->tensors[i].checksum) << ma->tensors[i].name;
    EXPECT_EQ(ma->tensors[i].offset, mb->tensors[i].offset) << ma->tensors[i].name;
  }
}

TEST(StagingBudgetTest, SmallBudgetStreamsAndNeverExceedsIt) {
  TempDir dir;
  TestState state = mixed_state(21);
  CheckpointOptions o = small_options();
  std::shared_ptr<IoEngine> engine = make_engine();
  ASSERT_NE(engine, nullptr);
  run_with_watchdog(seconds(60), "saves through a small staging budget", [&] {
    // Unbounded: staging grows as needed (windows written are reused by files started later).
    auto unbounded = make_writer(o, 0, engine);
    ASSERT_NE(unbounded, nullptr);
    FP_ASSERT_OK(run_job(dir.path(), "full", 1, state, o, *unbounded));
    EXPECT_GT(unbounded->staging_bytes(), 2 * o.staging_window_bytes);

    // Two windows, one window, a budget that is not a multiple of the window, and half a
    // window (the window shrinks to it).
    for (size_t budget : {2 * o.staging_window_bytes, o.staging_window_bytes,
                          3 * o.staging_window_bytes + 100, o.staging_window_bytes / 2}) {
      SCOPED_TRACE("budget " + std::to_string(budget));
      auto writer = make_writer(o, budget, engine);
      ASSERT_NE(writer, nullptr);
      std::string tag = "b" + std::to_string(budget);
      FP_ASSERT_OK(run_job(dir.path(), tag, 2, state, o, *writer));
      size_t window = writer->options().staging_window_bytes;
      size_t allowed = std::max(budget / window, size_t{1}) * window;
      EXPECT_LE(writer->staging_bytes(), allowed);
      EXPECT_LE(writer->staging_bytes(), budget);
      EXPECT_GT(writer->staging_bytes(), 0u);
      expect_same_data_files(dir.path() + "/full", dir.path() + "/" + tag);
      expect_checkpoint_matches(dir.path() + "/" + tag, state);
      // The staging is reused by a second save without growing.
      size_t before = writer->staging_bytes();
      FP_ASSERT_OK(run_job(dir.path(), tag + "-again", 3, state, o, *writer));
      EXPECT_EQ(writer->staging_bytes(), before);
      writer->release_staging();
      EXPECT_EQ(writer->staging_bytes(), 0u);
    }
  });
}

TEST(StagingBudgetTest, ManagerWithBudgetSavesIdenticalBytes) {
  TempDir dir;
  TestState state = mixed_state(22);
  CheckpointOptions budgeted = small_options();
  budgeted.staging_budget_bytes = 2 * budgeted.staging_window_bytes;
  budgeted.max_parallel_files = 3;
  run_with_watchdog(seconds(60), "manager with a staging budget", [&] {
    {
      FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir.file("a"), small_options()));
      FP_ASSERT_OK(mgr->save("t", state.content()));
    }
    FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir.file("b"), budgeted));
    // Twice: the second save reuses the windows of the first.
    FP_ASSERT_OK(mgr->save("t", state.content()));
    FP_ASSERT_OK(mgr->save("t2", state.content()));
    FP_ASSERT_OK(mgr->close());
  });
  expect_same_data_files(dir.file("a") + "/t", dir.file("b") + "/t");
  expect_same_data_files(dir.file("a") + "/t", dir.file("b") + "/t2");
  expect_checkpoint_matches(dir.file("b") + "/t2", state);
}

// A budget smaller than one staging window is still a cap: the window shrinks to it.
TEST(StagingBudgetTest, BudgetBelowOneWindowShrinksTheWindow) {
  TempDir dir;
  TestState state = mixed_state(23);
  CheckpointOptions o = small_options();  // 64 KiB windows
  o.staging_budget_bytes = 20 * 1024;     // 5 pages
  FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir.file("deep/er/root"), o));
  EXPECT_EQ(mgr->options().staging_window_bytes, 20u * 1024);
  FP_ASSERT_OK(mgr->save("t", state.content()));
  EXPECT_GT(mgr->staging_bytes(), 0u);
  EXPECT_LE(mgr->staging_bytes(), o.staging_budget_bytes);
  FP_ASSERT_OK(mgr->close());
  expect_checkpoint_matches(dir.file("deep/er/root") + "/t", state);

  o.staging_budget_bytes = 4095;
  auto refused = CheckpointManager::open(dir.file("other"), o);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("staging_budget"), std::string::npos);
}

TEST(StagingPoolTest, NeverMoreWindowsThanTheBudgetFromManyThreads) {
  constexpr size_t kWindow = 4096;
  StagingPool pool(kWindow, 3 * kWindow, false);
  EXPECT_EQ(pool.max_windows(), 3u);
  EXPECT_EQ(pool.window_bytes(), kWindow);
  std::atomic<int> out{0};
  std::atomic<int> peak{0};
  std::atomic<bool> failed{false};
  run_with_watchdog(seconds(30), "threads sharing a bounded pool", [&] {
    std::vector<std::thread> threads;
    for (int t = 0; t < 6; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 200; ++i) {
          auto w = pool.acquire();
          if (!w.is_ok() || !*w) {
            failed = true;
            return;
          }
          int now = ++out;
          int p = peak.load();
          while (now > p && !peak.compare_exchange_weak(p, now)) {
          }
          (*w)->data()[0] = std::byte{1};
          --out;
          pool.release(std::move(w).value());
        }
      });
    }
    for (auto& th : threads) th.join();
  });
  EXPECT_FALSE(failed.load());
  EXPECT_LE(peak.load(), 3);
  EXPECT_LE(pool.allocated_bytes(), 3 * kWindow);

  // try_acquire says "none" (nullptr, not an error) when the budget is used up.
  std::vector<std::unique_ptr<PinnedBuffer>> held;
  for (int i = 0; i < 3; ++i) {
    auto w = pool.try_acquire();
    ASSERT_TRUE(w.is_ok() && *w);
    EXPECT_GE((*w)->size(), kWindow);
    held.push_back(std::move(w).value());
  }
  auto none = pool.try_acquire();
  ASSERT_TRUE(none.is_ok());
  EXPECT_EQ(*none, nullptr);
  for (auto& w : held) pool.release(std::move(w));
}

}  // namespace
}  // namespace fastpersist::testing
