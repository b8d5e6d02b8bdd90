// SPDX-License-Identifier: Apache-2.0
// The maintenance calls (maintenance.h), which the CLI's list, verify, prune and drain are built
// on: root scans that report damage, prune plans that change nothing, ObjectStoreRoot on a store
// opened by URL (a directory-backed store behind a test opener), drains into a tier, and where
// each checkpoint lives.
#include "fastpersist/maintenance.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_test_util.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/manifest.h"
#include "fastpersist/object_store.h"
#include "testing/dir_object_store.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace fastpersist::testing {
namespace {

using Tags = std::vector<std::string>;

class MaintenanceTest : public ::testing::Test {
 protected:
  std::string root() const { return dir_.file("root"); }

  // step-1 .. step-N in root(), each committed.
  void save_steps(int n) {
    FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(root(), small_options()));
    for (int i = 1; i <= n; ++i) {
      TestState s = mixed_state(static_cast<uint64_t>(i));
      s.step = i;
      save_and_wait(*mgr, "step-" + std::to_string(i), s);
    }
    FP_ASSERT_OK(mgr->close());
  }

  // Bit rot in the first tensor's bytes of `tag` (its manifest still decodes, sizes still match).
  void rot(const std::string& tag) {
    FP_ASSERT_OK_AND_ASSIGN(Manifest m, read_manifest(root() + "/" + tag));
    const ManifestTensor& t = m.tensors.front();
    flip_byte(root() + "/" + tag + "/" + t.file, t.offset + t.length / 2);
  }

  TempDir dir_;
};

TEST_F(MaintenanceTest, ScanReportsCommittedAndDamagedCheckpoints) {
  save_steps(3);
  write_text(root() + "/step-2/manifest.json", "{ not json");
  FP_ASSERT_OK_AND_ASSIGN(RootScan scan, scan_any_root(root()));
  EXPECT_EQ(tags_of(scan.committed), (Tags{"step-1", "step-3"}));
  ASSERT_EQ(scan.damaged.size(), 1u);
  EXPECT_EQ(scan.damaged[0].tag, "step-2");
  EXPECT_FALSE(scan.damaged[0].sequence.has_value());  // its manifest does not decode
  EXPECT_EQ(scan.highest_sequence(), scan.committed.back().sequence);
}

TEST_F(MaintenanceTest, PrunePlanSaysWhyAndChangesNothing) {
  save_steps(4);
  FP_ASSERT_OK_AND_ASSIGN(PrunePlan plan, plan_prune(root(), {2, 3}));
  EXPECT_EQ(plan.remove, (Tags{"step-1", "step-2"}));
  EXPECT_EQ(plan.kept, (Tags{"step-3", "step-4"}));
  ASSERT_EQ(plan.kept_because.size(), 2u);
  EXPECT_EQ(plan.kept_because[1].first, "step-4");
  EXPECT_NE(plan.kept_because[0].second.find("milestone"), std::string::npos)
      << plan.kept_because[0].second;
  EXPECT_EQ(listed_tags(root()), (Tags{"step-1", "step-2", "step-3", "step-4"}));
}

// With a verifying engine, a rotten newest checkpoint stops counting: the plan keeps an older
// intact one in its place, and says which one failed.
TEST_F(MaintenanceTest, VerifiedPrunePlanKeepsTheNewestIntactCheckpoint) {
  save_steps(3);
  rot("step-3");
  FP_ASSERT_OK_AND_ASSIGN(PrunePlan unverified, plan_prune(root(), {1, std::nullopt}));
  EXPECT_EQ(unverified.remove, (Tags{"step-1", "step-2"}));
  auto engine = make_engine();
  ASSERT_NE(engine, nullptr);
  FP_ASSERT_OK_AND_ASSIGN(PrunePlan plan, plan_prune(root(), {1, std::nullopt}, engine.get()));
  EXPECT_EQ(plan.remove, (Tags{"step-1"}));
  ASSERT_EQ(plan.damaged.size(), 1u);
  EXPECT_EQ(plan.damaged[0].rfind("step-3: ", 0), 0u) << plan.damaged[0];
}

TEST_F(MaintenanceTest, DrainCopiesWhatTheTierLacksAndPlansChangeNothing) {
  save_steps(3);
  TierOptions tier;
  tier.path = dir_.file("tier");
  tier.keep_last = 2;
  FP_ASSERT_OK_AND_ASSIGN(Tags planned, plan_drain_into(root(), tier));
  EXPECT_EQ(planned, (Tags{"step-2", "step-3"}));  // step-1 would go at once
  EXPECT_FALSE(path_exists(tier.path));

  Tags began;
  FP_ASSERT_OK_AND_ASSIGN(DrainReport report,
                          drain_into(root(), tier, EngineOptions{},
                                     [&](const std::string& tag) { began.push_back(tag); }));
  EXPECT_TRUE(report.failures.empty()) << report.failures.front().to_string();
  EXPECT_EQ(report.drained, planned);
  EXPECT_EQ(began, planned);
  EXPECT_GT(report.bytes, 0u);
  EXPECT_EQ(listed_tags(tier.path), planned);
  FP_ASSERT_OK_AND_ASSIGN(Tags again, plan_drain_into(root(), tier));
  EXPECT_TRUE(again.empty());

  std::vector<std::string> unreachable;
  FP_ASSERT_OK_AND_ASSIGN(std::vector<CheckpointInfo> local, list_checkpoints(root()));
  std::vector<CheckpointPlace> places =
      locate_checkpoints(root(), local, {tier.path, dir_.file("no-such-tier")}, &unreachable);
  ASSERT_EQ(places.size(), 3u);
  EXPECT_EQ(places[0].roots, (Tags{root()}));
  EXPECT_EQ(places[2].roots, (Tags{root(), tier.path}));
  ASSERT_EQ(unreachable.size(), 1u);  // a tier that cannot be listed is named, not fatal
  EXPECT_EQ(unreachable[0].rfind(dir_.file("no-such-tier") + ": ", 0), 0u) << unreachable[0];
}

TEST_F(MaintenanceTest, ADrainIntoAFileOrAnOverlappingTierIsRefused) {
  save_steps(1);
  write_text(dir_.file("a-file"), "not a root");
  TierOptions tier;
  tier.path = dir_.file("a-file");
  auto plan = plan_drain_into(root(), tier);
  ASSERT_FALSE(plan.is_ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument) << plan.status().to_string();
  tier.path = root() + "/inside";
  auto inside = drain_into(root(), tier, EngineOptions{});
  ASSERT_FALSE(inside.is_ok());
  EXPECT_EQ(inside.status().code(), StatusCode::kInvalidArgument) << inside.status().to_string();
  EXPECT_FALSE(path_exists(tier.path));
}

// A root in an object store, opened by URL: scan, verify, a dry-run prune, then a real one.
TEST_F(MaintenanceTest, ObjectStoreRootScansVerifiesAndPrunes) {
  save_steps(3);
  auto store = std::make_shared<DirObjectStore>(dir_.file("store"), "test://bucket/run");
  set_object_store_opener([store](const std::string& url) -> Result<std::shared_ptr<ObjectStore>> {
    if (url != store->url()) return Status(StatusCode::kNotFound, "no store at " + url);
    return std::shared_ptr<ObjectStore>(store);
  });
  TierOptions tier;
  tier.path = store->url();
  tier.part_bytes = kMinTierPartBytes;
  FP_ASSERT_OK_AND_ASSIGN(DrainReport report, drain_into(root(), tier, EngineOptions{}));
  ASSERT_EQ(report.drained, (Tags{"step-1", "step-2", "step-3"}));

  FP_ASSERT_OK_AND_ASSIGN(auto objects, ObjectStoreRoot::open(store->url()));
  EXPECT_EQ(objects->url(), store->url());
  FP_ASSERT_OK_AND_ASSIGN(RootScan scan, objects->scan());
  EXPECT_EQ(tags_of(scan.committed), (Tags{"step-1", "step-2", "step-3"}));
  FP_ASSERT_OK_AND_ASSIGN(RootScan by_url, scan_any_root(store->url()));
  EXPECT_EQ(tags_of(by_url.committed), tags_of(scan.committed));

  auto engine = make_engine();
  ASSERT_NE(engine, nullptr);
  FP_ASSERT_OK_AND_ASSIGN(VerifyReport verified, objects->verify("step-2", *engine));
  EXPECT_TRUE(verified.ok());
  auto missing = objects->verify("step-9", *engine);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);

  FP_ASSERT_OK_AND_ASSIGN(PrunePlan dry, objects->prune({1, std::nullopt}, /*dry_run=*/true));
  EXPECT_EQ(dry.remove, (Tags{"step-1", "step-2"}));
  FP_ASSERT_OK_AND_ASSIGN(RootScan unchanged, objects->scan());
  EXPECT_EQ(unchanged.committed.size(), 3u);
  FP_ASSERT_OK_AND_ASSIGN(PrunePlan done, objects->prune({1, std::nullopt}, /*dry_run=*/false));
  EXPECT_EQ(done.remove, dry.remove);
  FP_ASSERT_OK_AND_ASSIGN(RootScan after, objects->scan());
  EXPECT_EQ(tags_of(after.committed), (Tags{"step-3"}));
  set_object_store_opener(nullptr);
}

}  // namespace
}  // namespace fastpersist::testing
