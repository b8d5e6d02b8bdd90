// SPDX-License-Identifier: Apache-2.0
// CheckpointOptions::checksums: on, every tensor has an XXH3-64 and the save reports the CPU time
// it cost; off, the manifest says "none", the data still round-trips, and verification checks
// only sizes and headers (it cannot see a flipped data byte, and says so).
#include <gtest/gtest.h>

#include "checkpoint/checkpoint_test_util.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/checksum.h"
#include "fastpersist/manifest.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace fastpersist::testing {
namespace {

TEST(ChecksumsOptionTest, OnRecordsEveryTensorsChecksum) {
  TempDir dir;
  TestState state = mixed_state(71);
  FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir.path(), small_options()));
  FP_ASSERT_OK_AND_ASSIGN(PendingSave p, mgr->save_async("on", state.content()));
  FP_ASSERT_OK(p.wait());
  EXPECT_GE(p.checksum_seconds(), 0.0);
  FP_ASSERT_OK_AND_ASSIGN(Manifest m, read_manifest(dir.file("on")));
  EXPECT_EQ(m.checksum_algorithm, kChecksumAlgorithm);
  for (const ManifestTensor& t : m.tensors) {
    const OwnedTensor* want = state.find(t.name);
    ASSERT_NE(want, nullptr);
    EXPECT_EQ(t.checksum, xxh3_64(want->bytes.data(), want->bytes.size())) << t.name;
  }
  const ManifestFile* objects = m.find_file("objects.pkl");
  ASSERT_NE(objects, nullptr);
  EXPECT_EQ(objects->checksum, xxh3_64(state.objects.data(), state.objects.size()));
  FP_ASSERT_OK_AND_ASSIGN(VerifyReport report, verify_checkpoint(dir.file("on"), mgr->engine()));
  EXPECT_TRUE(report.has_checksums);
  EXPECT_TRUE(report.ok()) << joined(report.problems);
}

TEST(ChecksumsOptionTest, OffStillRoundTripsAndVerifiesSizesAndHeaders) {
  TempDir dir;
  TestState state = mixed_state(72);
  CheckpointOptions o = small_options();
  o.checksums = false;
  FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir.path(), o));
  FP_ASSERT_OK_AND_ASSIGN(PendingSave p, mgr->save_async("off", state.content()));
  FP_ASSERT_OK(p.wait());
  EXPECT_EQ(p.checksum_seconds(), 0.0);
  std::string ckpt = dir.file("off");
  FP_ASSERT_OK_AND_ASSIGN(Manifest m, read_manifest(ckpt));
  EXPECT_EQ(m.checksum_algorithm, kNoChecksum);
  expect_checkpoint_matches(ckpt, state, /*verify=*/true);  // nothing to compare: not an error

  FP_ASSERT_OK_AND_ASSIGN(VerifyReport report, verify_checkpoint(ckpt, mgr->engine()));
  EXPECT_FALSE(report.has_checksums);
  EXPECT_TRUE(report.ok()) << joined(report.problems);

  // A truncated file is still caught (sizes), and a damaged header (parsed).
  const ManifestTensor& t = m.tensors[0];
  flip_byte(ckpt + "/" + t.file, 8);
  FP_ASSERT_OK_AND_ASSIGN(report, verify_checkpoint(ckpt, mgr->engine()));
  EXPECT_TRUE(any_contains(report.problems, t.file)) << joined(report.problems);
}

}  // namespace
}  // namespace fastpersist::testing
