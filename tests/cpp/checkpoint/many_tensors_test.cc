// SPDX-License-Identifier: Apache-2.0
// Regression: verify was quadratic in the tensors of one file (each tensor looked up in the
// data file's header by a scan, and each file's tensors found by scanning all of them), and
// manifest decoding was O(files x tensors): 30,000 tensors took 10.9 s to verify. Linear, they
// take a fraction of a second. The test times 7,500 and 30,000 tensors on the same machine:
// about 4x for linear code, 16x for the quadratic one, whatever the machine's or the build's
// speed (a sanitizer build is several times slower). bench/many_tensors_bench.py measures the
// curve.
#include <gtest/gtest.h>

#include <algorithm>
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

struct ScanSeconds {
  double list = 0;
  double verify = 0;
};

// Saves `n` one-element tensors into one data file, then times (best of three) listing the root
// and verifying the checkpoint.
ScanSeconds time_scans(size_t n) {
  TestState state;
  for (size_t i = 0; i < n; ++i) {
    state.add("layers." + std::to_string(i / 192) + ".mlp.experts." + std::to_string(i % 64) +
                  ".w" + std::to_string(i % 3) + ".weight",
              "F32", {1}, i);
  }
  TempDir root;
  CheckpointOptions options = small_options();
  options.target_file_bytes = 1 << 30;  // one data file holds them all
  auto mgr = CheckpointManager::open(root.path(), options);
  EXPECT_TRUE(mgr.is_ok()) << mgr.status().to_string();
  if (!mgr.is_ok()) return {};
  EXPECT_TRUE((*mgr)->save("moe", state.content()).is_ok());
  EXPECT_TRUE((*mgr)->close().is_ok());
  auto engine = make_engine();
  ScanSeconds best{1e9, 1e9};
  for (int round = 0; round < 3; ++round) {
    auto start = std::chrono::steady_clock::now();
    auto listed = list_checkpoints(root.path());
    best.list = std::min(best.list, seconds_since(start));
    EXPECT_TRUE(listed.is_ok() && listed->size() == 1u && (*listed)[0].num_tensors == n);
    start = std::chrono::steady_clock::now();
    auto report = verify_checkpoint(root.file("moe"), *engine);
    best.verify = std::min(best.verify, seconds_since(start));
    EXPECT_TRUE(report.is_ok() && report->ok());
  }
  return best;
}

// Linear, not quadratic, in the tensors of one file: four times the tensors take about four
// times as long (sixteen if quadratic); the bound, 10x, lies between. A ratio of two runs of the
// same machine, so that a slow machine or a sanitizer build does not fail it; 20 ms of slack
// for timer and cache noise. (8x was exceeded once, 8.7x, with a soak loading both cores.)
TEST(ManyTensorsTest, VerifyAndListingOfThirtyThousandTensorsInOneFileAreLinear) {
  const ScanSeconds small = time_scans(7500);
  const ScanSeconds large = time_scans(30000);
  EXPECT_LT(large.list, 10 * small.list + 0.02)
      << "listing (manifest decoding) is not linear: " << small.list << " s for 7500, "
      << large.list << " s for 30000";
  EXPECT_LT(large.verify, 10 * small.verify + 0.02)
      << "verify is not linear in the tensors of one file: " << small.verify << " s for 7500, "
      << large.verify << " s for 30000";
}

}  // namespace
}  // namespace fastpersist::testing
