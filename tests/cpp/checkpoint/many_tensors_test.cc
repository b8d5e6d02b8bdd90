// SPDX-License-Identifier: Apache-2.0
// Regression: verify was quadratic in the tensors of one file (each tensor looked up in the
// data file's header by a scan, and each file's tensors found by scanning all of them), and
// manifest decoding was O(files x tensors): 30,000 tensors took 10.9 s to verify. Linear, they
// take a fraction of a second; the bound below leaves a wide margin for a loaded machine while
// still failing for the quadratic code. bench/many_tensors_bench.py measures the curve.
#include <gtest/gtest.h>

#include <chrono>

#include "checkpoint/checkpoint_test_util.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/manifest.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace fastpersist::testing {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(ManyTensorsTest, VerifyAndListingOfThirtyThousandTensorsInOneFileAreLinear) {
  constexpr size_t kTensors = 30000;
  TestState state;
  for (size_t i = 0; i < kTensors; ++i) {
    state.add("layers." + std::to_string(i / 192) + ".mlp.experts." + std::to_string(i % 64) +
                  ".w" + std::to_string(i % 3) + ".weight",
              "F32", {1}, i);
  }
  TempDir root;
  CheckpointOptions options = small_options();
  options.target_file_bytes = 1 << 30;  // one data file holds them all
  FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(root.path(), options));
  FP_ASSERT_OK(mgr->save("moe", state.content()));
  FP_ASSERT_OK(mgr->close());
  auto engine = make_engine();
  ASSERT_NE(engine, nullptr);

  auto start = std::chrono::steady_clock::now();
  FP_ASSERT_OK_AND_ASSIGN(auto listed, list_checkpoints(root.path()));
  const double list_seconds = seconds_since(start);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].num_tensors, kTensors);

  start = std::chrono::steady_clock::now();
  FP_ASSERT_OK_AND_ASSIGN(VerifyReport report, verify_checkpoint(root.file("moe"), *engine));
  const double verify_seconds = seconds_since(start);
  EXPECT_TRUE(report.ok()) << joined(report.problems);

  EXPECT_LT(list_seconds, 5.0) << "listing (manifest decoding) is not linear";
  EXPECT_LT(verify_seconds, 5.0) << "verify is not linear in the tensors of one file";
}

}  // namespace
}  // namespace fastpersist::testing
