// SPDX-License-Identifier: Apache-2.0
// The save policy (CheckpointManager::should_save), the Young/Daly interval (advise_interval)
// and the blocking time every manifest records for `fastpersist advise --measure`.
#include "fastpersist/save_policy.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "checkpoint/checkpoint_test_util.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace fastpersist::testing {
namespace {

TEST(AdviseIntervalTest, YoungAndDalyFormulas) {
  // C = 30 s, M = 24 h: Young sqrt(2 C M) = 2276.8 s; Daly's correction is small here.
  FP_ASSERT_OK_AND_ASSIGN(IntervalAdvice a, advise_interval(30, 86400));
  EXPECT_NEAR(a.young_seconds, std::sqrt(2.0 * 30 * 86400), 1e-9);
  const double x = 30.0 / (2 * 86400);
  EXPECT_NEAR(a.interval_seconds, a.young_seconds * (1 + std::sqrt(x) / 3 + x / 9) - 30, 1e-9);
  EXPECT_EQ(a.interval_steps, std::nullopt);
  EXPECT_NEAR(a.checkpoint_overhead, 30 / (a.interval_seconds + 30), 1e-12);
  EXPECT_NEAR(a.expected_loss, (a.interval_seconds + 30) / 2 / 86400, 1e-12);
  EXPECT_NEAR(a.total_waste, a.checkpoint_overhead + a.expected_loss, 1e-12);
  // The advice is (near) the minimum of the waste: a shorter or longer interval wastes more.
  auto waste = [](double tau) { return 30 / (tau + 30) + (tau + 30) / 2 / 86400; };
  EXPECT_LT(waste(a.interval_seconds), waste(a.interval_seconds * 0.8));
  EXPECT_LT(waste(a.interval_seconds), waste(a.interval_seconds * 1.25));
}

TEST(AdviseIntervalTest, StepsRestartsAndTheCheckpointCostlierThanTheFailureRate) {
  FP_ASSERT_OK_AND_ASSIGN(IntervalAdvice a, advise_interval(30, 86400, 1.5, 600));
  ASSERT_TRUE(a.interval_steps.has_value());
  EXPECT_EQ(*a.interval_steps, std::llround(a.interval_seconds / 1.5));
  const double tau = static_cast<double>(*a.interval_steps) * 1.5;
  EXPECT_NEAR(a.expected_loss, ((tau + 30) / 2 + 600) / 86400, 1e-12);
  FP_ASSERT_OK_AND_ASSIGN(IntervalAdvice tiny_steps, advise_interval(30, 86400, 1e6));
  EXPECT_EQ(tiny_steps.interval_steps, 1) << "at least one step";
  FP_ASSERT_OK_AND_ASSIGN(IntervalAdvice dear, advise_interval(3 * 3600, 3600));
  EXPECT_EQ(dear.interval_seconds, 3600) << "C >= 2M: Daly says tau = M";
}

TEST(AdviseIntervalTest, BadTimesAreRefused) {
  for (double bad : {0.0, -1.0, std::nan(""), HUGE_VAL}) {
    EXPECT_EQ(advise_interval(bad, 100).status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(advise_interval(1, bad).status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(advise_interval(1, 100, bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(advise_interval(1, 100, std::nullopt, -1).status().code(),
            StatusCode::kInvalidArgument);
  // Out of range: no overflow into non-finite advice, no step count that does not fit.
  EXPECT_EQ(advise_interval(1e308, 100).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(advise_interval(1, 1e308).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(advise_interval(1e9, 1e9 * 3600, 1e-9).status().code(), StatusCode::kInvalidArgument);
  auto tiny = advise_interval(1e9, 1e11, 1e-9);
  ASSERT_FALSE(tiny.is_ok());
  EXPECT_NE(tiny.status().message().find("step time is too small"), std::string::npos)
      << tiny.status().to_string();
  // The largest accepted times give finite, consistent advice.
  FP_ASSERT_OK_AND_ASSIGN(IntervalAdvice edge, advise_interval(1e12, 1e12, 1e12, 1e12));
  EXPECT_TRUE(std::isfinite(edge.interval_seconds) && std::isfinite(edge.total_waste));
  EXPECT_EQ(edge.interval_steps, 1);
}

class SavePolicyTest : public ::testing::Test {
 protected:
  std::unique_ptr<CheckpointManager> open(SavePolicy policy) {
    CheckpointOptions o = small_options();
    o.save_policy = policy;
    auto m = CheckpointManager::open(root_.path(), o);
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    return m.is_ok() ? std::move(m).value() : nullptr;
  }
  TempDir root_;
};

TEST_F(SavePolicyTest, EveryNStepsAndNeverTwiceForOneStep) {
  SavePolicy p;
  p.every_steps = 100;
  auto m = open(p);
  ASSERT_NE(m, nullptr);
  std::vector<int64_t> due;
  for (int64_t step = 0; step <= 350; ++step) {
    FP_ASSERT_OK_AND_ASSIGN(bool yes, m->should_save(step));
    if (yes) due.push_back(step);
  }
  EXPECT_EQ(due, (std::vector<int64_t>{0, 100, 200, 300}));
  FP_ASSERT_OK_AND_ASSIGN(bool again, m->should_save(300));
  EXPECT_FALSE(again);
}

// "Not yet due" holds only while less than the interval has passed since the clock started; a
// slow machine (a sanitizer build on a busy disk) may take longer than that to open the manager
// or to save, so each such check is made only when the time measured around it allows it.
TEST_F(SavePolicyTest, EverySecondsSinceTheLastSave) {
  using Clock = std::chrono::steady_clock;
  auto seconds_since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  SavePolicy p;
  p.every_seconds = 1.0;
  Clock::time_point opened = Clock::now();
  auto m = open(p);
  ASSERT_NE(m, nullptr);
  FP_ASSERT_OK_AND_ASSIGN(bool early, m->should_save(1));
  if (seconds_since(opened) < *p.every_seconds) {
    EXPECT_FALSE(early);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1050));
  FP_ASSERT_OK_AND_ASSIGN(bool late, m->should_save(2));
  EXPECT_TRUE(late);
  TestState s = mixed_state();
  Clock::time_point saved = Clock::now();
  FP_ASSERT_OK(m->save("s", s.content()));  // a save restarts the clock
  FP_ASSERT_OK_AND_ASSIGN(bool after, m->should_save(3));
  if (seconds_since(saved) < *p.every_seconds) {
    EXPECT_FALSE(after) << "the save restarted the clock";
  }
}

TEST_F(SavePolicyTest, NoPolicyOrABadOneIsRefused) {
  auto m = open(SavePolicy{});
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->should_save(1).status().code(), StatusCode::kInvalidArgument);
  FP_ASSERT_OK(m->close());
  for (SavePolicy bad : {SavePolicy{0, std::nullopt}, SavePolicy{std::nullopt, 0.0},
                         SavePolicy{std::nullopt, std::nan("")}, SavePolicy{std::nullopt, -5.0}}) {
    CheckpointOptions o = small_options();
    o.save_policy = bad;
    EXPECT_EQ(CheckpointManager::open(root_.file("other"), o).status().code(),
              StatusCode::kInvalidArgument);
  }
}

TEST_F(SavePolicyTest, EveryManifestRecordsTheSaveBlockingTime) {
  auto m = open(SavePolicy{});
  ASSERT_NE(m, nullptr);
  TestState s = mixed_state();
  auto pending = m->save_async("s", s.content());
  ASSERT_TRUE(pending.is_ok());
  FP_ASSERT_OK(pending->wait());
  FP_ASSERT_OK_AND_ASSIGN(Manifest manifest, read_manifest(root_.file("s")));
  ASSERT_TRUE(manifest.blocking_seconds.has_value());
  EXPECT_GT(*manifest.blocking_seconds, 0);
  EXPECT_LE(*manifest.blocking_seconds, pending->total_seconds());
}

}  // namespace
}  // namespace fastpersist::testing
