// SPDX-License-Identifier: Apache-2.0
// Staged reads (src/load/staged_read.h): byte ranges of files land in caller memory at any
// address, whatever the slot size, the gaps between ranges and the files they come from; each
// range's checksum is reported once; errors stop the read without a hang. And through
// CheckpointReader: misaligned destinations are verified, and damage is named.
#include "load/staged_read.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "checkpoint/checkpoint_test_util.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/checksum.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace fastpersist::testing {
namespace {

using checkpoint::StagedReadOptions;
using checkpoint::StagedTarget;

struct Range {
  size_t file;
  uint64_t offset;
  uint64_t length;
};

class StagedReadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = make_engine();
    ASSERT_NE(engine_, nullptr);
    for (size_t f = 0; f < 2; ++f) {
      files_.push_back(dir_.file("data" + std::to_string(f)));
      contents_.push_back(random_bytes((3 << 20) + 123 * f + 7, 40 + f));
      FP_ASSERT_OK(write_whole_file(files_.back(), contents_.back()));
    }
  }

  // Reads `ranges` into one buffer at odd addresses (misaligned by `skew`) and checks bytes and
  // checksums.
  void read_and_check(const std::vector<Range>& ranges, StagedReadOptions o, size_t skew) {
    std::vector<StagedTarget> targets;
    std::vector<std::vector<std::byte>> memory;
    for (const Range& r : ranges) memory.emplace_back(r.length + skew);
    for (size_t i = 0; i < ranges.size(); ++i) {
      const Range& r = ranges[i];
      targets.push_back(
          {files_[r.file], contents_[r.file].size(), r.offset, r.length, memory[i].data() + skew});
    }
    std::map<size_t, uint64_t> sums;
    o.on_checksum = [&](size_t target, uint64_t sum) {
      EXPECT_EQ(sums.count(target), 0u) << "reported twice: " << target;
      sums[target] = sum;
      return Status::ok();
    };
    FP_ASSERT_OK(checkpoint::read_staged(*engine_, targets, o));
    for (size_t i = 0; i < ranges.size(); ++i) {
      const Range& r = ranges[i];
      std::span<const std::byte> want(contents_[r.file].data() + r.offset, r.length);
      ASSERT_EQ(
          "", first_difference(want, std::span<const std::byte>(memory[i].data() + skew, r.length)))
          << "range " << i << " of file " << r.file << " at " << r.offset;
      if (r.length > 0) {
        ASSERT_EQ(sums.count(i), 1u) << i;
        EXPECT_EQ(sums[i], xxh3_64(want.data(), want.size())) << i;
      }
    }
  }

  TempDir dir_;
  std::shared_ptr<IoEngine> engine_;
  std::vector<std::string> files_;
  std::vector<std::vector<std::byte>> contents_;
};

TEST_F(StagedReadTest, RandomRangesAtAnyAddressWithAnySlotSize) {
  std::mt19937_64 rng(7);
  for (uint64_t slot : {uint64_t{4096}, uint64_t{12288}, uint64_t{1} << 20, uint64_t{32} << 20}) {
    for (size_t skew : {size_t{0}, size_t{1}, size_t{64}}) {
      // Disjoint ranges of both files, in shuffled order: adjacent, with small and large gaps,
      // crossing slot boundaries, one reaching each file's last byte.
      std::vector<Range> ranges;
      for (size_t f = 0; f < 2; ++f) {
        uint64_t pos = rng() % 5000;
        const uint64_t size = contents_[f].size();
        while (pos < size) {
          uint64_t len =
              std::min<uint64_t>(size - pos, 1 + rng() % (rng() % 4 == 0 ? 400000 : 9000));
          if (rng() % 6 == 0) len = size - pos;
          ranges.push_back({f, pos, len});
          uint64_t gap = rng() % 3 == 0 ? 0 : rng() % (rng() % 2 ? 100 : 3 << 20);
          pos += len + gap;
        }
      }
      std::shuffle(ranges.begin(), ranges.end(), rng);
      StagedReadOptions o;
      o.slot_bytes = slot;
      o.slots = 1 + rng() % 4;
      o.max_gap_bytes = rng() % 2 ? 0 : 1 << 20;
      SCOPED_TRACE("slot " + std::to_string(slot) + " skew " + std::to_string(skew) + " slots " +
                   std::to_string(o.slots) + " ranges " + std::to_string(ranges.size()));
      read_and_check(ranges, o, skew);
    }
  }
}

TEST_F(StagedReadTest, WholeFilesAndEmptyRanges) {
  StagedReadOptions o;
  o.slot_bytes = 1 << 20;
  read_and_check({{0, 0, contents_[0].size()}, {1, 0, contents_[1].size()}, {0, 5, 0}}, o, 3);
}

TEST_F(StagedReadTest, AChecksumVerdictStopsTheRead) {
  std::vector<std::byte> a(1 << 20), b(1 << 20);
  std::vector<StagedTarget> targets = {
      {files_[0], contents_[0].size(), 0, a.size(), a.data()},
      {files_[0], contents_[0].size(), 2 << 20, b.size(), b.data()}};
  StagedReadOptions o;
  o.slot_bytes = 64 << 10;
  int calls = 0;
  o.on_checksum = [&](size_t target, uint64_t) {
    ++calls;
    return target == 0 ? Status(StatusCode::kDataLoss, "bad tensor zero") : Status::ok();
  };
  Status st = checkpoint::read_staged(*engine_, targets, o);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_EQ(calls, 1) << "nothing is delivered after the first failure";
}

TEST_F(StagedReadTest, BadTargetsAndReadErrors) {
  std::vector<std::byte> a(4096);
  StagedReadOptions o;
  auto beyond = checkpoint::read_staged(*engine_, {{files_[0], 100, 50, 51, a.data()}}, o);
  EXPECT_EQ(beyond.code(), StatusCode::kInvalidArgument);
  auto no_memory = checkpoint::read_staged(*engine_, {{files_[0], 100, 0, 10, nullptr}}, o);
  EXPECT_EQ(no_memory.code(), StatusCode::kInvalidArgument);
  o.slot_bytes = 1000;
  EXPECT_EQ(checkpoint::read_staged(*engine_, {{files_[0], 100, 0, 10, a.data()}}, o).code(),
            StatusCode::kInvalidArgument);
  // A file that is shorter than the caller believes (truncated after it was listed).
  std::vector<std::byte> big(2 << 20);
  StagedReadOptions small;
  small.slot_bytes = 64 << 10;
  Status st = checkpoint::read_staged(
      *engine_, {{dir_.file("missing"), big.size(), 0, big.size(), big.data()}}, small);
  EXPECT_FALSE(st.is_ok());
  FP_ASSERT_OK(write_whole_file(dir_.file("short"), random_bytes(100000, 3)));
  st = checkpoint::read_staged(
      *engine_, {{dir_.file("short"), big.size(), 0, big.size(), big.data()}}, small);
  EXPECT_FALSE(st.is_ok()) << "a short read must fail, not leave zeros";
}

// Through the reader: destinations at addresses that do not line up with the file take the
// staged path, are verified, and a flipped byte is named.
TEST(CheckpointReaderStaged, MisalignedDestinationsAreReadAndVerified) {
  TempDir dir;
  TestState state = mixed_state(11);
  {
    FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir.path(), small_options()));
    FP_ASSERT_OK(mgr->save("s", state.content()));
  }
  std::string ck = dir.file("s");
  auto engine = make_engine();
  FP_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::open(ck, engine));
  const Manifest& m = reader->manifest();
  std::vector<std::vector<std::byte>> dest;
  std::vector<TensorReadRequest> requests;
  for (size_t k = 0; k < m.tensors.size(); ++k) dest.emplace_back(m.tensors[k].length + 64 + 1);
  for (size_t k = 0; k < m.tensors.size(); ++k)
    requests.push_back({k, dest[k].data() + 1 + k % 64, m.tensors[k].length});
  for (uint64_t budget : {uint64_t{0}, uint64_t{8192}, uint64_t{1} << 20}) {
    FP_ASSERT_OK_AND_ASSIGN(auto result, reader->read(requests, /*verify=*/true, budget));
    for (size_t k = 0; k < m.tensors.size(); ++k) {
      const OwnedTensor* want = state.find(m.tensors[k].name);
      ASSERT_NE(want, nullptr);
      EXPECT_EQ("", first_difference(want->bytes, std::span<const std::byte>(result.data[k],
                                                                             m.tensors[k].length)))
          << m.tensors[k].name << " budget " << budget;
    }
  }
  // Damage the largest tensor's last byte: the staged path names it.
  size_t big = 0;
  for (size_t k = 0; k < m.tensors.size(); ++k) {
    if (m.tensors[k].length > m.tensors[big].length) big = k;
  }
  const ManifestTensor& t = m.tensors[big];
  flip_byte(ck + "/" + t.file, t.offset + t.length - 1);
  auto damaged = reader->read(requests, /*verify=*/true);
  ASSERT_FALSE(damaged.is_ok());
  EXPECT_EQ(damaged.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(damaged.status().message().find(t.name), std::string::npos)
      << damaged.status().to_string();
  FP_ASSERT_OK(reader->read(requests, /*verify=*/false).status());
}

}  // namespace
}  // namespace fastpersist::testing
