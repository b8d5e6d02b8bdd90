// SPDX-License-Identifier: Apache-2.0
// plan_files: how many data files, which tensors go where (balanced, each exactly once), their
// order inside a file (widest element first, so every tensor is aligned to its element size),
// and headers that parse back to the planned layout.
#include "write/shard_plan.h"

#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "checkpoint/checkpoint_test_util.h"
#include "fastpersist/safetensors.h"
#include "testing/status_matchers.h"

namespace fastpersist::testing {
namespace {

using checkpoint::plan_files;
using checkpoint::PlannedFile;

CheckpointOptions plan_options(uint64_t target, uint64_t min_file, unsigned parallel) {
  CheckpointOptions o;
  o.target_file_bytes = target;
  o.min_file_bytes = min_file;
  o.max_parallel_files = parallel;
  return o;
}

// Every structural promise of a plan.
void check_plan(const std::vector<PlannedFile>& files, const std::vector<TensorSource>& tensors) {
  std::vector<int> seen(tensors.size(), 0);
  for (size_t f = 0; f < files.size(); ++f) {
    const PlannedFile& file = files[f];
    EXPECT_EQ(file.name, data_file_name(f, files.size()));
    EXPECT_EQ(file.header.size() % 4096, 0u);
    EXPECT_EQ(file.layout.data_start, file.header.size());
    EXPECT_EQ(file.size, file.layout.file_bytes());
    ASSERT_EQ(file.layout.tensors.size(), file.tensors.size());
    uint64_t data = 0;
    size_t prev_elem = SIZE_MAX;
    for (size_t k = 0; k < file.tensors.size(); ++k) {
      const TensorSource& t = tensors[file.tensors[k]];
      ++seen[file.tensors[k]];
      const SafetensorsTensor& at = file.layout.tensors[k];
      EXPECT_EQ(at.name, t.name) << "layout order is file order";
      EXPECT_EQ(at.nbytes(), t.nbytes);
      size_t elem = *safetensors_dtype_size(t.dtype);
      EXPECT_LE(elem, prev_elem) << "widest element first";
      prev_elem = elem;
      EXPECT_EQ((file.layout.data_start + at.begin) % elem, 0u) << t.name;
      data += t.nbytes;
    }
    EXPECT_EQ(file.layout.data_bytes, data);
    // The header parses back to the same layout.
    auto parsed = parse_safetensors_header(file.header, file.size, file.name);
    ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
    EXPECT_EQ(parsed->data_start, file.layout.data_start);
    ASSERT_EQ(parsed->tensors.size(), file.tensors.size());
    for (const SafetensorsTensor& p : parsed->tensors) {
      auto k = file.layout.find(p.name);
      ASSERT_TRUE(k.has_value()) << p.name;
      EXPECT_EQ(p.begin, file.layout.tensors[*k].begin) << p.name;
      EXPECT_EQ(p.end, file.layout.tensors[*k].end) << p.name;
    }
  }
  for (size_t i = 0; i < tensors.size(); ++i) EXPECT_EQ(seen[i], 1) << tensors[i].name;
}

TEST(ShardPlanTest, MixedStateIsBalancedAndAligned) {
  TestState state = mixed_state();
  CheckpointContent c = state.content();
  FP_ASSERT_OK_AND_ASSIGN(auto files,
                          plan_files(c.tensors, plan_options(256 * kKiB, 64 * kKiB, 3)));
  check_plan(files, c.tensors);
  // ~1.07 MB at 256 KiB per file: 5 files by size.
  EXPECT_EQ(files.size(), (state.total_bytes() + 256 * kKiB - 1) / (256 * kKiB));
  uint64_t lo = UINT64_MAX, hi = 0;
  for (const PlannedFile& f : files) {
    lo = std::min(lo, f.layout.data_bytes);
    hi = std::max(hi, f.layout.data_bytes);
  }
  EXPECT_LE(hi - lo, 160000u)
      << "largest-first onto the least filled keeps files within one tensor";
}

TEST(ShardPlanTest, FileCount) {
  TestState state;
  for (int i = 0; i < 16; ++i)
    state.add("t" + std::to_string(i), "F32", {1024}, static_cast<uint64_t>(i));  // 4 KiB each
  CheckpointContent c = state.content();
  auto count = [&](uint64_t target, uint64_t min_file, unsigned parallel) -> size_t {
    auto files = plan_files(c.tensors, plan_options(target, min_file, parallel));
    EXPECT_TRUE(files.is_ok()) << files.status().to_string();
    if (!files.is_ok()) return 0;
    check_plan(*files, c.tensors);
    return files->size();
  };
  EXPECT_EQ(count(1 << 30, 64 << 20, 4), 1u);   // small state: one file
  EXPECT_EQ(count(1 << 30, 16 * kKiB, 4), 4u);  // enough for 4 files of 16 KiB: parallel
  EXPECT_EQ(count(1 << 30, 16 * kKiB, 8), 4u);  // ... but never below min_file_bytes
  EXPECT_EQ(count(16 * kKiB, 1 << 30, 1), 4u);  // by target size
  EXPECT_EQ(count(1, 1, 64), 16u);              // never more files than tensors
  EXPECT_EQ(count(0, 0, 0), 16u);               // zeros are clamped, not divided by
}

TEST(ShardPlanTest, NoTensorsMakesNoDataFile) {
  FP_ASSERT_OK_AND_ASSIGN(auto files, plan_files({}, CheckpointOptions{}));
  EXPECT_TRUE(files.empty());
}

TEST(ShardPlanTest, EmptyTensorsOnly) {
  TestState state;
  state.add("z1", "F32", {0}, 1);
  state.add("z0", "F32", {0}, 2);
  state.add("z2", "I64", {3, 0}, 3);
  CheckpointContent c = state.content();
  FP_ASSERT_OK_AND_ASSIGN(auto files, plan_files(c.tensors, plan_options(1, 1, 4)));
  check_plan(files, c.tensors);
}

TEST(ShardPlanTest, RefusesBadTensors) {
  std::byte data[16] = {};
  auto refuse = [&](TensorSource t, const std::string& needle) {
    auto r = plan_files({t}, CheckpointOptions{});
    ASSERT_FALSE(r.is_ok()) << needle;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().to_string();
  };
  refuse({"x", "F32", {4}, data, 15}, "nbytes");
  refuse({"x", "F32", {4}, nullptr, 16}, "no data");
  refuse({"x", "Q8", {4}, data, 4}, "dtype");
  refuse({"", "F32", {4}, data, 16}, "empty name");
  refuse({"__x", "F32", {4}, data, 16}, "reserved");
  refuse({"x", "F32", {UINT64_MAX / 2, 4}, data, 16}, "'x'");
  auto dup =
      plan_files({{"x", "U8", {1}, data, 1}, {"x", "U8", {1}, data, 1}}, CheckpointOptions{});
  EXPECT_EQ(dup.status().code(), StatusCode::kInvalidArgument);
  // An empty tensor needs no data pointer.
  FP_EXPECT_OK(plan_files({{"e", "F32", {0}, nullptr, 0}}, CheckpointOptions{}));
}

TEST(ShardPlanTest, DataFileNames) {
  EXPECT_EQ(data_file_name(0, 1), "tensors-00000-of-00001.safetensors");
  EXPECT_EQ(data_file_name(11, 12), "tensors-00011-of-00012.safetensors");
}

}  // namespace
}  // namespace fastpersist::testing
