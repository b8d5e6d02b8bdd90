// SPDX-License-Identifier: Apache-2.0
// The search of `fastpersist tune` (tools/tune_search.h) against made-up throughput functions
// with a known best: it finds the best, measures far fewer settings than the full grid, keeps
// to its budget, repeats the contenders, and stops on a measurement's error.
#include "tune_search.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <map>
#include <string>

namespace fastpersist::cli::tune {
namespace {

Space grid() {
  Space s;
  s.backends = {Backend::kIoUring, Backend::kLibaio, Backend::kThreads};
  for (size_t kib : {128, 256, 512, 1024, 2048, 4096, 8192, 16384})
    s.block_sizes.push_back(kib << 10);
  s.queue_depths = {4, 8, 16, 32, 64, 128};
  s.parallelism = {1, 2, 4, 8};
  return s;
}

size_t grid_size(const Space& s) {
  return s.backends.size() * s.block_sizes.size() * s.queue_depths.size() * s.parallelism.size() *
         s.single_submit.size() * s.overlap_events.size();
}

// A smooth landscape whose best is libaio, 2 MiB blocks, queue depth 16, parallelism 4,
// batched submits, overlapped events: each setting's factor peaks at its best value.
double landscape(const Candidate& c) {
  auto peak = [](double x, double best) {
    return 1.0 / (1.0 + 0.3 * std::pow(std::log2(x / best), 2));
  };
  double backend = c.engine.backend == Backend::kLibaio    ? 1.0
                   : c.engine.backend == Backend::kIoUring ? 0.9
                                                           : 0.5;
  return 3.0 * backend * peak(static_cast<double>(c.engine.block_size), 2 << 20) *
         peak(c.engine.queue_depth, 16) * peak(c.engine.intra_op_parallelism, 4) *
         (c.engine.single_submit ? 0.8 : 1.0) * (c.engine.overlap_events ? 1.0 : 0.9);
}

Candidate start() {
  Candidate c;
  c.engine.backend = Backend::kIoUring;
  c.engine.block_size = 8 << 20;
  c.engine.queue_depth = 32;
  c.engine.intra_op_parallelism = 1;
  return c;
}

// A clock that advances one second per measurement, so budgets are exact.
struct FakeTime {
  std::chrono::steady_clock::time_point now{};
  Clock clock() {
    return [this] { return now; };
  }
  void tick() { now += std::chrono::seconds(1); }
};

TEST(TuneSearchTest, FindsTheBestOfASmoothLandscapeMeasuringAFractionOfTheGrid) {
  FakeTime t;
  std::map<std::string, int> seen;
  Measure m = [&](const Candidate& c) -> Result<double> {
    t.tick();
    ++seen[c.key()];
    return landscape(c);
  };
  SearchOptions o;
  o.budget_seconds = 1000;
  Result<Outcome> r = search(grid(), start(), o, m, {}, t.clock());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const Candidate& best = r->ranked.front().candidate;
  EXPECT_EQ(best.engine.backend, Backend::kLibaio);
  EXPECT_EQ(best.engine.block_size, size_t{2} << 20);
  EXPECT_EQ(best.engine.queue_depth, 16u);
  EXPECT_EQ(best.engine.intra_op_parallelism, 4u);
  EXPECT_FALSE(best.engine.single_submit);
  EXPECT_TRUE(best.engine.overlap_events);
  EXPECT_FALSE(r->out_of_budget);
  EXPECT_LT(seen.size(), grid_size(grid()) / 10) << "coordinate descent, not the grid";
  // The contenders (within 90% of the best) were measured `repeats` times; ranked by median.
  EXPECT_EQ(r->ranked.front().rates.size(), o.repeats);
  for (size_t i = 1; i < r->ranked.size(); ++i) {
    EXPECT_GE(r->ranked[i - 1].median(), r->ranked[i].median());
  }
  EXPECT_EQ(r->measurements, static_cast<size_t>([&] {
              int n = 0;
              for (const auto& [k, v] : seen) n += v;
              return n;
            }()));
}

TEST(TuneSearchTest, PrunesAScanAfterTwoClearlyWorseValues) {
  // Throughput collapses past 256 KiB blocks. From 128 KiB the scan up measures 256 KiB (as
  // good), then 512 KiB and 1 MiB (a quarter of the best: clearly worse) and stops there: the
  // larger blocks are never measured.
  Space s;
  for (size_t kib : {128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536})
    s.block_sizes.push_back(kib << 10);
  s.single_submit.clear();
  s.overlap_events.clear();
  std::map<size_t, int> tried;
  Measure m = [&](const Candidate& c) -> Result<double> {
    ++tried[c.engine.block_size];
    return c.engine.block_size <= (size_t{256} << 10) ? 4.0 : 1.0;
  };
  Candidate c = start();
  c.engine.block_size = size_t{128} << 10;
  SearchOptions o;
  o.repeats = 1;
  Result<Outcome> r = search(s, c, o, m);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->ranked.front().median(), 4.0);
  EXPECT_EQ(tried.size(), 4u);
  EXPECT_EQ(tried.count(size_t{2} << 20), 0u);
  for (const auto& [block, times] : tried)
    EXPECT_EQ(times, 1) << block << ": measured once, then reused";
}

TEST(TuneSearchTest, KeepsToItsBudget) {
  FakeTime t;
  Measure m = [&](const Candidate& c) -> Result<double> {
    t.tick();
    return landscape(c);
  };
  SearchOptions o;
  o.budget_seconds = 10;
  Result<Outcome> r = search(grid(), start(), o, m, {}, t.clock());
  ASSERT_TRUE(r.is_ok());
  EXPECT_TRUE(r->out_of_budget);
  EXPECT_LE(r->measurements, 11u);  // the check comes before each measurement
  EXPECT_GE(r->measurements, 10u);
  // A budget smaller than one measurement still measures the start.
  o.budget_seconds = 0.001;
  r = search(grid(), start(), o, m, {}, t.clock());
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->measurements, 1u);
  EXPECT_EQ(r->ranked.front().candidate, start());
}

TEST(TuneSearchTest, ReportsProgressAndStopsOnAMeasurementError) {
  size_t calls = 0, last_n = 0;
  Progress p = [&](size_t n, const Candidate&, double rate, double spent) {
    ++calls;
    last_n = n;
    EXPECT_GT(rate, 0);
    EXPECT_GE(spent, 0);
    EXPECT_LE(spent, 1);
  };
  int n = 0;
  Measure m = [&](const Candidate& c) -> Result<double> {
    if (++n == 5) return Status(StatusCode::kIoError, "the disk went away");
    return landscape(c);
  };
  Result<Outcome> r = search(grid(), start(), SearchOptions{}, m, p);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIoError);
  EXPECT_NE(r.status().message().find("went away"), std::string::npos);
  EXPECT_EQ(calls, 4u);
  EXPECT_EQ(last_n, 4u);
}

}  // namespace
}  // namespace fastpersist::cli::tune
