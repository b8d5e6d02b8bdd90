// SPDX-License-Identifier: Apache-2.0
// Tiers (tier.h): committed checkpoints drained into a second root in the background, verified
// on the way and committed there with the same protocol; each tier's selection and retention;
// local pins; failures that never fail a local save but are reported and retried; a damaged
// local copy refused; incremental bases sent first; close() with a timeout; a drain that died
// resumed; a full tier (ENOSPC on a loop-mounted ext4, root only); and the plan itself.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_test_util.h"
#include "checkpoint_dir/checkpoint_fs.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "testing/mount_util.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"
#include "tier/tier_copy.h"
#include "tier/tier_drain.h"

namespace fastpersist::testing {
namespace {

std::string csv(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& x : v) out += (out.empty() ? "" : ", ") + x;
  return out;
}

TierOptions at(const std::string& path) {
  TierOptions t;
  t.path = path;
  return t;
}

TestState stepped_state(int64_t step) {
  TestState s = mixed_state(static_cast<uint64_t>(step));
  s.step = step;
  return s;
}

class TierTest : public ::testing::Test {
 protected:
  std::string local() const { return dir_.file("local"); }
  std::string tier_path(int i = 0) const { return dir_.file("tier" + std::to_string(i)); }

  CheckpointOptions options(std::vector<TierOptions> tiers) const {
    CheckpointOptions o = small_options();
    o.tiers = std::move(tiers);
    return o;
  }
  TierOptions tier(int i = 0) const {
    TierOptions t;
    t.path = tier_path(i);
    return t;
  }
  std::unique_ptr<CheckpointManager> open(const CheckpointOptions& o) {
    auto m = CheckpointManager::open(local(), o);
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    return m.is_ok() ? std::move(m).value() : nullptr;
  }
  std::vector<Status> save(CheckpointManager& m, const std::string& tag, const TestState& s) {
    auto pending = m.save_async(tag, s.content());
    EXPECT_TRUE(pending.is_ok()) << pending.status().to_string();
    if (!pending.is_ok()) return {};
    Status st = pending->wait();
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return pending->tier_errors();
  }

  TempDir dir_;
};

TEST_F(TierTest, DrainsEveryCommitIntoTheTierVerifiedAndLoadable) {
  auto m = open(options({tier()}));
  ASSERT_NE(m, nullptr);
  std::vector<TestState> states;
  for (int64_t step = 1; step <= 3; ++step) {
    states.push_back(stepped_state(step));
    EXPECT_TRUE(save(*m, "s" + std::to_string(step), states.back()).empty());
  }
  FP_ASSERT_OK(m->wait_drains());
  EXPECT_EQ(csv(listed_tags(tier_path())), "s1, s2, s3");
  for (int64_t step = 1; step <= 3; ++step) {
    std::string tag = "s" + std::to_string(step);
    expect_verifies(tier_path() + "/" + tag);
    expect_checkpoint_matches(tier_path() + "/" + tag, states[static_cast<size_t>(step - 1)]);
    FP_ASSERT_OK_AND_ASSIGN(Manifest here, read_manifest(local() + "/" + tag));
    FP_ASSERT_OK_AND_ASSIGN(Manifest there, read_manifest(tier_path() + "/" + tag));
    EXPECT_EQ(here.created_unix, there.created_unix) << "a copy keeps the original's age";
    EXPECT_EQ(here.fingerprint, there.fingerprint);
    EXPECT_EQ(here.metadata_json, there.metadata_json);
  }
  EXPECT_EQ(read_text(tier_path() + "/latest"), "s3\n");
  std::vector<TierState> states_now = m->tier_states();
  ASSERT_EQ(states_now.size(), 1u);
  EXPECT_EQ(states_now[0].checkpoints_drained, 3u);
  EXPECT_EQ(states_now[0].last_drained, "s3");
  EXPECT_GT(states_now[0].bytes_drained, 3 * states[0].total_bytes());
  EXPECT_TRUE(states_now[0].waiting.empty());
  EXPECT_TRUE(states_now[0].last_error.is_ok());
  FP_ASSERT_OK(m->close());
  EXPECT_TRUE(names_with_prefix(tier_path(), ".tmp-").empty());
}

TEST_F(TierTest, EachTierSelectsByStepAndKeepsItsOwnRetention) {
  TierOptions every_two = tier(0);
  every_two.every = 2;
  TierOptions last_two = tier(1);
  last_two.keep_last = 2;
  auto m = open(options({every_two, last_two}));
  ASSERT_NE(m, nullptr);
  for (int64_t step = 1; step <= 5; ++step) {
    save(*m, "s" + std::to_string(step), stepped_state(step));
    FP_ASSERT_OK(m->wait_drains());
  }
  EXPECT_EQ(csv(listed_tags(local())), "s1, s2, s3, s4, s5");
  EXPECT_EQ(csv(listed_tags(tier_path(0))), "s2, s4");
  EXPECT_EQ(csv(listed_tags(tier_path(1))), "s4, s5");
  FP_ASSERT_OK(m->close());
}

TEST_F(TierTest, ATierThatFailsNeverFailsALocalSaveAndIsReportedPinnedAndRetried) {
  // The tier's path is a regular file: it cannot be opened until that file goes.
  write_text(tier_path(), "in the way");
  CheckpointOptions o = options({tier()});
  o.keep_last = 1;
  auto m = open(o);
  ASSERT_NE(m, nullptr);
  save(*m, "s1", stepped_state(1));  // may already report the first pass, made at open
  Status drained = m->wait_drains();
  EXPECT_FALSE(drained.is_ok());
  EXPECT_NE(drained.message().find(tier_path()), std::string::npos) << drained.to_string();
  std::vector<Status> reported = save(*m, "s2", stepped_state(2));  // the save itself succeeds
  ASSERT_FALSE(reported.empty()) << "the next save reports the failed drain";
  EXPECT_NE(reported[0].message().find("tier"), std::string::npos) << reported[0].to_string();
  save(*m, "s3", stepped_state(3));
  // keep_last 1, but nothing reached the tier: every checkpoint stays pinned.
  EXPECT_EQ(csv(listed_tags(local())), "s1, s2, s3");
  Status removal = m->remove("s1");
  EXPECT_EQ(removal.code(), StatusCode::kBusy) << removal.to_string();
  EXPECT_NE(removal.message().find("drained"), std::string::npos) << removal.to_string();
  EXPECT_FALSE(m->tier_states()[0].last_error.is_ok());
  // The tier comes back: the next pass drains everything, then local retention catches up.
  ASSERT_EQ(::unlink(tier_path().c_str()), 0);
  FP_ASSERT_OK(m->wait_drains());
  EXPECT_EQ(csv(listed_tags(tier_path())), "s1, s2, s3");
  EXPECT_EQ(csv(listed_tags(local())), "s3");
  FP_ASSERT_OK(m->close());
}

TEST_F(TierTest, WithoutPinsLocalRetentionGoesFirstAndTheDrainSkipsWhatIsGone) {
  write_text(tier_path(), "in the way");
  CheckpointOptions o = options({tier()});
  o.keep_last = 1;
  o.pin_until_drained = false;
  auto m = open(o);
  ASSERT_NE(m, nullptr);
  for (int64_t step = 1; step <= 3; ++step)
    save(*m, "s" + std::to_string(step), stepped_state(step));
  EXPECT_EQ(csv(listed_tags(local())), "s3");
  ASSERT_EQ(::unlink(tier_path().c_str()), 0);
  FP_ASSERT_OK(m->wait_drains());
  EXPECT_EQ(csv(listed_tags(tier_path())), "s3");
  FP_ASSERT_OK(m->close());
}

TEST_F(TierTest, ADamagedLocalCopyIsNotDrainedAndNamesTheTensor) {
  TestState s1 = stepped_state(1), s2 = stepped_state(2);
  {
    auto m = open(small_options());
    ASSERT_NE(m, nullptr);
    save(*m, "s1", s1);
    save(*m, "s2", s2);
    FP_ASSERT_OK(m->close());
  }
  // The newest is damaged, so every pass tries it again (an older checkpoint than the tier's
  // newest is never sent, so a damaged s1 behind a drained s2 would be tried only by the first
  // pass, which wait_drains may or may not have begun after).
  FP_ASSERT_OK_AND_ASSIGN(Manifest manifest, read_manifest(local() + "/s2"));
  const ManifestTensor& victim =
      manifest.tensors[manifest.find_tensor("model.layer0.weight").value()];
  flip_byte(local() + "/s2/" + victim.file, victim.offset + 100);
  auto m = open(options({tier()}));  // its first pass drains what the tier lacks
  ASSERT_NE(m, nullptr);
  Status drained = m->wait_drains();
  EXPECT_EQ(drained.code(), StatusCode::kDataLoss) << drained.to_string();
  EXPECT_NE(drained.message().find("model.layer0.weight"), std::string::npos)
      << drained.to_string();
  EXPECT_EQ(csv(listed_tags(tier_path())), "s1") << "the intact one goes on";
  EXPECT_TRUE(names_with_prefix(tier_path(), ".tmp-").empty()) << "no partial copy is left";
  expect_checkpoint_matches(tier_path() + "/s1", s1);
  (void)m->close();
}

TEST_F(TierTest, AnIncrementalCheckpointTravelsAfterItsBaseAndLoadsFromTheTier) {
  CheckpointOptions o = options({tier()});
  o.incremental = true;
  o.compression_threads = 2;
  TestState s = stepped_state(1);
  {
    // The base is made before the tier exists, so the tier first receives both together.
    CheckpointOptions no_tier = o;
    no_tier.tiers.clear();
    auto m = open(no_tier);
    ASSERT_NE(m, nullptr);
    save(*m, "base", s);
    FP_ASSERT_OK(m->close());
  }
  auto m = open(o);
  ASSERT_NE(m, nullptr);
  FP_ASSERT_OK(m->wait_drains());
  s.tensors[0].bytes = random_bytes(s.tensors[0].bytes.size(), 99);
  s.step = 2;
  auto pending = m->save_async("delta", s.content());
  ASSERT_TRUE(pending.is_ok());
  FP_ASSERT_OK(pending->wait());
  EXPECT_EQ(pending->base_tag(), "base");
  FP_ASSERT_OK(m->wait_drains());
  EXPECT_EQ(csv(listed_tags(tier_path())), "base, delta");
  FP_ASSERT_OK_AND_ASSIGN(auto infos, list_checkpoints(tier_path()));
  EXPECT_EQ(csv(infos.back().references), "base");
  expect_verifies(tier_path() + "/delta");
  expect_checkpoint_matches(tier_path() + "/delta", s);
  FP_ASSERT_OK(m->close());
}

// Found by the soak: retention (keep_last 1) removes users before their base; users still
// waiting for the tier stay (pinned), and so must their base, though it was drained and is not
// pinned itself: removing it damaged them, locally and for the drain that was to copy them.
TEST_F(TierTest, RetentionKeepsTheBaseOfIncrementalCheckpointsThatWaitForATier) {
  // The tier is reached through a symbolic link, switched atomically between the real directory
  // and a file: a retrying drain never finds the path missing (and never creates it).
  const std::string real = dir_.file("tier-real"), blocker = dir_.file("blocker"),
                    link = dir_.file("tier-link");
  ASSERT_EQ(::mkdir(real.c_str(), 0755), 0);
  write_text(blocker, "in the way");
  auto point_tier_to = [&](const std::string& target) {
    const std::string next = link + ".next";
    ASSERT_EQ(::symlink(target.c_str(), next.c_str()), 0) << std::strerror(errno);
    ASSERT_EQ(::rename(next.c_str(), link.c_str()), 0) << std::strerror(errno);
  };
  point_tier_to(real);
  CheckpointOptions o = options({at(link)});
  o.incremental = true;
  o.full_every = 3;
  o.keep_last = 1;
  auto m = open(o);
  ASSERT_NE(m, nullptr);
  std::vector<TestState> states;
  TestState s = stepped_state(1);
  for (int64_t step = 1; step <= 4; ++step) {
    s.tensors[0].bytes = random_bytes(s.tensors[0].bytes.size(), 500 + static_cast<uint64_t>(step));
    s.step = step;
    states.push_back(s);
  }
  save(*m, "s1", states[0]);
  FP_ASSERT_OK(m->wait_drains());  // s1 is in the tier: no longer pinned
  point_tier_to(blocker);
  for (size_t i = 1; i < 4; ++i)
    save(*m, "s" + std::to_string(i + 1), states[i]);  // s2, s3 on s1; s4 full
  FP_ASSERT_OK_AND_ASSIGN(auto infos, list_checkpoints(local()));
  std::string listed;
  for (const CheckpointInfo& c : infos) listed += c.tag + "(" + csv(c.references) + ") ";
  EXPECT_EQ(listed, "s1() s2(s1) s3(s1) s4() ");
  expect_verifies(local() + "/s2");
  expect_checkpoint_matches(local() + "/s3", states[2]);
  // The tier comes back: s2, s3 and s4 drain, then local retention removes s2 and s3, then s1.
  point_tier_to(real);
  FP_ASSERT_OK(m->wait_drains());
  EXPECT_EQ(csv(listed_tags(local())), "s4");
  EXPECT_EQ(csv(listed_tags(real)), "s1, s2, s3, s4");
  expect_checkpoint_matches(real + "/s3", states[2]);
  FP_ASSERT_OK(m->close());
}

// Found by the soak: a drain sends a base again when a newer checkpoint references it and the
// tier's retention had removed it. That copy arrives last but is old: the tier's retention
// counts it by its age, so it never pushes out a newer checkpoint (by commit order in the tier
// it was the newest, and keep_last removed a newer one in its place).
TEST_F(TierTest, ATiersRetentionCountsACopyThatArrivesLateByItsAge) {
  {
    auto m = open(small_options());
    ASSERT_NE(m, nullptr);
    for (int64_t step = 1; step <= 4; ++step)
      save(*m, "s" + std::to_string(step), stepped_state(step));
    FP_ASSERT_OK(m->close());
  }
  TierOptions t = tier();
  t.keep_last = 2;
  FP_ASSERT_OK_AND_ASSIGN(auto destination, checkpoint::open_tier(t, small_options()));
  auto engine = make_engine();
  for (const char* tag : {"s2", "s3", "s1"}) {
    FP_ASSERT_OK(checkpoint::copy_checkpoint(local(), tag, *engine, *destination).status());
  }
  // s1 arrived last: kept for now (what was just committed always is), but it is the oldest.
  EXPECT_EQ(csv(listed_tags(tier_path())), "s2, s3, s1");
  FP_ASSERT_OK(checkpoint::copy_checkpoint(local(), "s4", *engine, *destination).status());
  FP_ASSERT_OK_AND_ASSIGN(auto infos, list_checkpoints(tier_path()));
  std::vector<std::string> left;
  for (const CheckpointInfo& c : infos) left.push_back(c.tag);
  std::sort(left.begin(), left.end());
  EXPECT_EQ(csv(left), "s3, s4") << "the newest two by age, not by arrival (s1, s4)";
  FP_ASSERT_OK(destination->close());
}

// Fault injection: a real directory tier whose copy of one tag fails once with an I/O error.
class FailsOnceTarget : public checkpoint::TierTarget {
 public:
  FailsOnceTarget(checkpoint::TierTarget& real, std::string victim)
      : real_(real), victim_(std::move(victim)) {}
  const std::string& where() const override { return real_.where(); }
  Result<std::vector<CheckpointInfo>> list() override { return real_.list(); }
  Result<checkpoint::CopyResult> receive(const std::string& local_root, const std::string& tag,
                                         IoEngine& engine,
                                         const checkpoint::CopyPacer& pacer) override {
    if (tag == victim_ && !failed_) {
      failed_ = true;
      return Status(StatusCode::kIoError, "injected: the tier's disk failed a write", EIO);
    }
    return real_.receive(local_root, tag, engine, pacer);
  }
  Status close() override { return real_.close(); }

 private:
  checkpoint::TierTarget& real_;
  std::string victim_;
  bool failed_ = false;
};

TEST_F(TierTest, AFailedCopyHoldsBackTheNewerOnesSoThatTheRetrySendsItInOrder) {
  {
    auto m = open(small_options());
    ASSERT_NE(m, nullptr);
    for (int64_t step = 1; step <= 3; ++step)
      save(*m, "s" + std::to_string(step), stepped_state(step));
    FP_ASSERT_OK(m->close());
  }
  FP_ASSERT_OK_AND_ASSIGN(auto real, checkpoint::open_tier_target(tier(), small_options()));
  FailsOnceTarget flaky(*real, "s1");
  FP_ASSERT_OK_AND_ASSIGN(auto local_infos, list_checkpoints(local()));
  auto engine = make_engine();
  auto plan = [&] { return checkpoint::plan_drain(local_infos, real->list().value(), tier()); };
  ASSERT_EQ(csv(plan()), "s1, s2, s3");
  checkpoint::TierPass first =
      checkpoint::drain_tier(local(), plan(), local_infos, *engine, flaky, {});
  ASSERT_EQ(first.failures.size(), 1u);
  EXPECT_NE(first.failures[0].message().find("'s1'"), std::string::npos)
      << first.failures[0].to_string();
  // Had s2 and s3 gone on, the tier's newest would be s3 and no plan would send s1 again.
  EXPECT_TRUE(first.drained.empty()) << csv(first.drained);
  EXPECT_EQ(csv(plan()), "s1, s2, s3") << "all three still wait";
  checkpoint::TierPass retry =
      checkpoint::drain_tier(local(), plan(), local_infos, *engine, flaky, {});
  EXPECT_TRUE(retry.failures.empty());
  EXPECT_EQ(csv(retry.drained), "s1, s2, s3");
  FP_ASSERT_OK(real->close());
  EXPECT_EQ(csv(listed_tags(tier_path())), "s1, s2, s3");
}

TEST_F(TierTest, CloseWithATimeoutStopsASlowDrainAndTheNextManagerFinishesIt) {
  TierOptions slow = tier();
  slow.bandwidth_bytes_per_second = 64 * kKiB;  // ~1 MiB state: about 16 s
  TestState s = stepped_state(1);
  {
    auto m = open(options({slow}));
    ASSERT_NE(m, nullptr);
    save(*m, "s1", s);
    auto began = std::chrono::steady_clock::now();
    Status closed = m->close(0.5);
    double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    EXPECT_EQ(closed.code(), StatusCode::kBusy) << closed.to_string();
    EXPECT_LT(took, 5.0);
  }
  EXPECT_TRUE(listed_tags(tier_path()).empty()) << "a tier never shows a partial checkpoint";
  auto m = open(options({tier()}));  // no cap now
  ASSERT_NE(m, nullptr);
  FP_ASSERT_OK(m->wait_drains());
  EXPECT_EQ(csv(listed_tags(tier_path())), "s1");
  EXPECT_TRUE(names_with_prefix(tier_path(), ".tmp-").empty()) << "the dead drain's debris is gone";
  expect_checkpoint_matches(tier_path() + "/s1", s);
  FP_ASSERT_OK(m->close());
}

TEST_F(TierTest, ATierHeldByAnotherManagerIsReportedBusy) {
  auto holder = CheckpointManager::open(tier_path(), small_options());
  ASSERT_TRUE(holder.is_ok()) << holder.status().to_string();
  auto m = open(options({tier()}));
  ASSERT_NE(m, nullptr);
  save(*m, "s1", stepped_state(1));
  Status drained = m->wait_drains();
  EXPECT_EQ(drained.code(), StatusCode::kBusy) << drained.to_string();
  FP_ASSERT_OK((*holder)->close());
  FP_ASSERT_OK(m->wait_drains());
  EXPECT_EQ(csv(listed_tags(tier_path())), "s1");
  FP_ASSERT_OK(m->close());
}

TEST_F(TierTest, TiersThatOverlapTheRootOrEachOtherAreRefused) {
  auto inside = CheckpointManager::open(local(), options({at(local() + "/tier")}));
  EXPECT_EQ(inside.status().code(), StatusCode::kInvalidArgument);
  auto same = CheckpointManager::open(local(), options({at(local() + "/.")}));
  EXPECT_EQ(same.status().code(), StatusCode::kInvalidArgument);
  auto twice = CheckpointManager::open(local(), options({tier(), tier()}));
  EXPECT_EQ(twice.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(twice.status().message().find("same directory"), std::string::npos)
      << twice.status().to_string();
  TierOptions zero = tier();
  zero.keep_last = 0;
  EXPECT_EQ(CheckpointManager::open(local(), options({zero})).status().code(),
            StatusCode::kInvalidArgument);
  TierOptions never = tier();
  never.every = 0;
  EXPECT_EQ(CheckpointManager::open(local(), options({never})).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckpointManager::open(local(), options({at("")})).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(TierTest, LocationsNameEveryPlaceAndPullBringsALostCheckpointBack) {
  CheckpointOptions o = options({tier()});
  o.incremental = true;
  TestState s1 = stepped_state(1);
  TestState s2 = s1;
  s2.tensors[1].bytes = random_bytes(s2.tensors[1].bytes.size(), 7);
  s2.step = 2;
  {
    auto m = open(o);
    ASSERT_NE(m, nullptr);
    save(*m, "s1", s1);
    save(*m, "s2", s2);  // incremental: references s1
    FP_ASSERT_OK(m->wait_drains());
    std::vector<std::string> unreachable;
    FP_ASSERT_OK_AND_ASSIGN(auto places, m->locations(&unreachable));
    ASSERT_EQ(places.size(), 2u);
    EXPECT_EQ(places[1].info.tag, "s2");
    EXPECT_TRUE(places[1].local);
    EXPECT_EQ(csv(places[1].roots), local() + ", " + tier_path());
    EXPECT_TRUE(unreachable.empty());
    FP_ASSERT_OK(m->close());
  }
  // The local disk is lost.
  FP_ASSERT_OK(checkpoint::remove_tree(local()));
  auto m = open(o);
  ASSERT_NE(m, nullptr);
  FP_ASSERT_OK_AND_ASSIGN(auto places, m->locations());
  ASSERT_EQ(places.size(), 2u);
  EXPECT_FALSE(places[1].local);
  EXPECT_EQ(csv(places[1].roots), tier_path());
  FP_ASSERT_OK_AND_ASSIGN(uint64_t pulled, m->pull(tier_path(), "s2"));
  EXPECT_GT(pulled, 0u);
  EXPECT_EQ(csv(listed_tags(local())), "s1, s2") << "the base came with it";
  expect_checkpoint_matches(local() + "/s2", s2);
  FP_ASSERT_OK_AND_ASSIGN(uint64_t again, m->pull(tier_path(), "s2"));
  EXPECT_EQ(again, 0u) << "already local";
  EXPECT_EQ(m->pull(dir_.file("elsewhere"), "s2").status().code(), StatusCode::kInvalidArgument);
  // A damaged tier copy is refused, and nothing partial appears locally.
  FP_ASSERT_OK(m->wait_drains());  // the pulled copy is pinned until a pass sees it is in the tier
  FP_ASSERT_OK(m->remove("s2"));
  FP_ASSERT_OK_AND_ASSIGN(Manifest manifest, read_manifest(tier_path() + "/s2"));
  std::string own;
  for (const ManifestFile& f : manifest.files) {
    if (f.role == "tensors" && referenced_checkpoint(f).empty()) own = f.name;
  }
  ASSERT_FALSE(own.empty());
  flip_byte(tier_path() + "/s2/" + own, 200);
  EXPECT_EQ(m->pull(tier_path(), "s2").status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(csv(listed_tags(local())), "s1");
  FP_ASSERT_OK(m->close());
}

CheckpointInfo info(const std::string& tag, double created, std::optional<int64_t> step,
                    std::vector<std::string> references = {}) {
  CheckpointInfo c;
  c.tag = tag;
  c.created_unix = created;
  c.step = step;
  c.references = std::move(references);
  return c;
}

TEST(PlanDrainTest, SendsOnlyWhatIsNewerSelectedAndWorthKeepingWithBasesFirst) {
  std::vector<CheckpointInfo> local = {info("a", 1, 10), info("b", 2, 20), info("c", 3, 30, {"a"}),
                                       info("d", 4, 40, {"a"}), info("e", 5, std::nullopt)};
  TierOptions all;
  all.path = "t";
  EXPECT_EQ(csv(checkpoint::plan_drain(local, {}, all)), "a, b, c, d, e");
  // The tier holds b: older ones (a) are not sent again, but c's base is.
  EXPECT_EQ(csv(checkpoint::plan_drain(local, {info("b", 2, 20)}, all)), "a, c, d, e");
  TierOptions every20 = all;
  every20.every = 20;
  EXPECT_EQ(csv(checkpoint::plan_drain(local, {}, every20)), "b, a, d");  // d's base before d
  TierOptions last1 = all;
  last1.keep_last = 1;
  EXPECT_EQ(csv(checkpoint::plan_drain(local, {}, last1)), "e");
  TierOptions milestones = last1;
  milestones.keep_every = 30;
  EXPECT_EQ(csv(checkpoint::plan_drain(local, {}, milestones)), "a, c, e");
  EXPECT_TRUE(checkpoint::plan_drain(local, local, all).empty());
}

TEST(CopyPacerTest, PausesWhileToldCapsTheRateAndStopsWhenCancelled) {
  using Clock = std::chrono::steady_clock;
  auto seconds_since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  const Clock::time_point until = Clock::now() + std::chrono::milliseconds(150);
  auto paused = checkpoint::make_pacer(0, nullptr, [&] { return Clock::now() < until; });
  auto began = Clock::now();
  FP_ASSERT_OK(paused(0));
  EXPECT_GE(seconds_since(began), 0.14) << "waits while a snapshot runs";
  auto capped = checkpoint::make_pacer(10 << 20);  // 10 MiB/s
  began = Clock::now();  // before the pacer's own start, so a preemption between cannot shorten it
  FP_ASSERT_OK(capped(0));
  FP_ASSERT_OK(capped(2 << 20));  // 2 MiB copied: 0.2 s at the cap
  EXPECT_GE(seconds_since(began), 0.19);
  std::atomic<bool> cancel{true};
  EXPECT_EQ(checkpoint::make_pacer(0, &cancel)(0).code(), StatusCode::kBusy);
}

class TierEnospcTest : public TierTest {
 protected:
  static void SetUpTestSuite() {
    if (::geteuid() == 0) (void)enter_private_mount_namespace();
  }
};

TEST_F(TierEnospcTest, AFullTierKeepsLocalSavesGoingAndDrainsOnceThereIsRoom) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a small ext4 needs root";
  std::string mnt = dir_.file("mnt");
  ASSERT_EQ(::mkdir(mnt.c_str(), 0755), 0) << std::strerror(errno);
  auto mount = ScopedMount::ext4_image(dir_.file("fs.img"), mnt, 24 * kMiB);
  if (!mount.is_ok())
    GTEST_SKIP() << "cannot mount the test filesystem: " << mount.status().to_string();
  TestState big;
  for (int i = 0; i < 3; ++i)
    big.add("big" + std::to_string(i), "U8", {5 * kMiB + 3}, 10 + static_cast<uint64_t>(i));
  TierOptions full;
  full.path = mnt + "/tier";
  full.keep_last = 1;
  CheckpointOptions o = options({full});
  o.target_file_bytes = 6 * kMiB;
  o.min_file_bytes = 1 * kMiB;
  auto m = open(o);
  ASSERT_NE(m, nullptr);
  write_text(mnt + "/ballast", std::string(12 * kMiB, 'x'));  // leaves less than one checkpoint
  save(*m, "s1", big);
  Status drained = m->wait_drains();
  EXPECT_EQ(drained.sys_errno(), ENOSPC) << drained.to_string();
  save(*m, "s2", big);  // local saves go on
  EXPECT_EQ(m->wait_drains().sys_errno(), ENOSPC) << "retried, still full";
  EXPECT_TRUE(listed_tags(full.path).empty());
  EXPECT_TRUE(names_with_prefix(full.path, ".tmp-").empty()) << "the failed copy is removed";
  ASSERT_EQ(::unlink((mnt + "/ballast").c_str()), 0);
  FP_ASSERT_OK(m->wait_drains());
  EXPECT_EQ(csv(listed_tags(full.path)), "s2") << "keep_last 1: only the newest is worth sending";
  expect_checkpoint_matches(full.path + "/s2", big);
  FP_ASSERT_OK(m->close());
}

}  // namespace
}  // namespace fastpersist::testing
