// SPDX-License-Identifier: Apache-2.0
// A save that fails in the background (a state bigger than a small loop-mounted ext4): the
// failure is ENOSPC with its path, the temporary directory is gone, older checkpoints stay
// intact and listed, an uncollected failure is reported by the manager's next call (once), and
// saving works again once there is room. Needs root for the mount; skipped otherwise.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>

#include "checkpoint/checkpoint_test_util.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "testing/mount_util.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"
#include "testing/watchdog.h"

namespace fastpersist::testing {
namespace {

using std::chrono::seconds;

class EnospcTest : public ::testing::TestWithParam<bool> {
 protected:
  static void SetUpTestSuite() {
    if (::geteuid() == 0) (void)enter_private_mount_namespace();  // best effort
  }

  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "mounting a small ext4 needs root";
    mount_point_ = dir_.file("mnt");
    ASSERT_EQ(::mkdir(mount_point_.c_str(), 0755), 0) << std::strerror(errno);
    auto m = ScopedMount::ext4_image(dir_.file("fs.img"), mount_point_, 24 * kMiB);
    if (!m.is_ok()) GTEST_SKIP() << "cannot mount the test filesystem: " << m.status().to_string();
    mount_.emplace(std::move(m).value());
    root_ = mount_point_ + "/ckpts";
    small_.add("w", "F32", {1000}, 1);
    small_.add("b", "U8", {77}, 2);
    small_.objects = "small objects";
    // Three ~10 MiB tensors in three files: more than the filesystem holds, so some files may
    // get their space and another not (the failure stops the others).
    for (int i = 0; i < 3; ++i)
      big_.add("big" + std::to_string(i), "U8", {10 * kMiB + 3}, 10 + static_cast<uint64_t>(i));
  }

  CheckpointOptions options() const {
    CheckpointOptions o = small_options();
    o.durable = GetParam();
    o.target_file_bytes = 11 * kMiB;
    o.min_file_bytes = 1 * kMiB;
    o.max_parallel_files = 3;
    return o;
  }

  void expect_enospc(const Status& st) {
    EXPECT_EQ(st.code(), StatusCode::kIoError) << st.to_string();
    EXPECT_EQ(st.sys_errno(), ENOSPC) << st.to_string();
    EXPECT_FALSE(st.path().empty()) << st.to_string();
  }

  void expect_clean_root() {
    EXPECT_TRUE(names_with_prefix(root_, ".tmp-").empty()) << "the failed save's directory is left";
    EXPECT_TRUE(names_with_prefix(root_, ".latest").empty());
  }

  TempDir dir_;
  std::string mount_point_;
  std::string root_;
  std::optional<ScopedMount> mount_;  // unmounted before dir_ is removed
  TestState small_;
  TestState big_;
};

TEST_P(EnospcTest, WaitReportsTheFailureAndOlderCheckpointsSurvive) {
  run_with_watchdog(seconds(120), "saves onto a full filesystem", [&] {
    FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(root_, options()));
    FP_ASSERT_OK(mgr->save("ok-1", small_.content()));

    FP_ASSERT_OK_AND_ASSIGN(PendingSave p, mgr->save_async("too-big", big_.content()));
    Status st = p.wait();
    expect_enospc(st);
    EXPECT_TRUE(p.done());
    expect_clean_root();
    EXPECT_FALSE(path_exists(root_ + "/too-big"));
    EXPECT_EQ(listed_tags(root_), (std::vector<std::string>{"ok-1"}));
    FP_ASSERT_OK_AND_ASSIGN(auto latest, latest_checkpoint(root_));
    EXPECT_EQ(latest, std::optional<std::string>("ok-1"));
    FP_ASSERT_OK_AND_ASSIGN(VerifyReport report, verify_checkpoint(root_ + "/ok-1", mgr->engine()));
    EXPECT_TRUE(report.ok()) << joined(report.problems);
    expect_checkpoint_matches(root_ + "/ok-1", small_);

    // Collected by wait(): nobody reports it again.
    FP_ASSERT_OK(mgr->save("ok-2", small_.content()));
    FP_ASSERT_OK(mgr->wait_all());
    EXPECT_EQ(listed_tags(root_), (std::vector<std::string>{"ok-1", "ok-2"}));
    FP_ASSERT_OK(mgr->close());
  });
}

TEST_P(EnospcTest, AnUncollectedFailureIsReportedOnceByTheNextSave) {
  run_with_watchdog(seconds(120), "uncollected failure", [&] {
    CheckpointOptions o = options();
    o.max_in_flight = 1;
    FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(root_, o));
    FP_ASSERT_OK(mgr->save("ok-1", small_.content()));
    FP_ASSERT_OK_AND_ASSIGN(PendingSave ignored, mgr->save_async("too-big", big_.content()));
    (void)ignored;

    // The next save_async waits for room (max_in_flight 1), then reports the earlier failure
    // instead of queueing.
    auto next = mgr->save_async("ok-2", small_.content());
    ASSERT_FALSE(next.is_ok());
    expect_enospc(next.status());
    EXPECT_FALSE(path_exists(root_ + "/ok-2"));
    expect_clean_root();

    // Reported once: the following save works (the failed save's space was given back).
    FP_ASSERT_OK_AND_ASSIGN(PendingSave p, mgr->save_async("ok-2", small_.content()));
    FP_ASSERT_OK(p.wait());
    EXPECT_EQ(listed_tags(root_), (std::vector<std::string>{"ok-1", "ok-2"}));

    // Room made by removing checkpoints: a state that fits now saves.
    TestState medium;
    medium.add("m", "U8", {12 * kMiB}, 5);
    FP_ASSERT_OK(mgr->remove("ok-1"));
    FP_ASSERT_OK(mgr->save("medium", medium.content()));
    expect_checkpoint_matches(root_ + "/medium", medium);
    FP_ASSERT_OK(mgr->close());
  });
}

TEST_P(EnospcTest, WaitDoneObservesAFailureWithoutReportingIt) {
  FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(root_, options()));
  FP_ASSERT_OK_AND_ASSIGN(PendingSave ok, mgr->save_async("ok-1", small_.content()));
  EXPECT_TRUE(ok.wait_done());
  FP_ASSERT_OK_AND_ASSIGN(PendingSave p, mgr->save_async("too-big", big_.content()));
  EXPECT_FALSE(p.wait_done());  // an observer (an on-commit hook) learns it failed ...
  EXPECT_TRUE(p.done());
  // ... and the failure is still reported, once, to the caller: by the next save.
  auto next = mgr->save_async("ok-2", small_.content());
  expect_enospc(next.status());
  FP_ASSERT_OK(mgr->save("ok-2", small_.content()));
  FP_ASSERT_OK(ok.wait());
}

TEST_P(EnospcTest, WaitAllAndCloseReportAnUncollectedFailure) {
  run_with_watchdog(seconds(120), "failure reported by wait_all / close", [&] {
    {
      FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(root_, options()));
      FP_ASSERT_OK_AND_ASSIGN(PendingSave p, mgr->save_async("too-big", big_.content()));
      (void)p;
      Status st = mgr->wait_all();
      expect_enospc(st);
      FP_EXPECT_OK(mgr->wait_all());  // once
      FP_EXPECT_OK(mgr->close());
    }
    {
      FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(root_, options()));
      FP_ASSERT_OK_AND_ASSIGN(PendingSave p, mgr->save_async("too-big", big_.content()));
      // wait_snapshot() of a save that failed before its snapshot ended reports the failure,
      // else returns OK and the failure comes with close().
      Status snap = p.wait_snapshot();
      Status closed = mgr->close();
      if (snap.is_ok()) {
        expect_enospc(closed);
      } else {
        expect_enospc(snap);
        FP_EXPECT_OK(closed);
      }
      expect_enospc(p.wait());  // the handle still tells
    }
    expect_clean_root();
    EXPECT_TRUE(listed_tags(root_).empty());
  });
}

INSTANTIATE_TEST_SUITE_P(Durability, EnospcTest, ::testing::Bool(), [](const auto& p) {
  return p.param ? std::string("Durable") : std::string("NotDurable");
});

}  // namespace
}  // namespace fastpersist::testing
