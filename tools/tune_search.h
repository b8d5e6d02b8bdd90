// SPDX-License-Identifier: Apache-2.0
// The search of `fastpersist tune` (tune_command.cc), apart from the I/O it times, so that it
// can be tested with a made-up throughput function.
//
// A candidate is one set of engine settings (backend, block size, queue depth, parallelism,
// single_submit, overlap_events) plus, for writes, FastFileWriter's staging size. The search is
// coordinate descent from a start: for each setting in turn, every value of its range is tried
// with the others held at the best found so far, and the best is kept. Along an ordered range
// (block size, queue depth, parallelism, staging), a scan stops in a direction after two values
// in a row below `prune_ratio` of the best: they are clearly worse, and so are those past them.
// The passes repeat while one changes the best and time is left. Then the candidates within
// `repeat_ratio` of the best are measured again, round-robin, until each has `repeats` samples
// or the budget is spent; they are ranked by their median, which separates noise from a real
// difference. Every measurement counts against the budget; the first one always runs.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "fastpersist/options.h"
#include "fastpersist/status.h"

namespace fastpersist::cli::tune {

struct Candidate {
  EngineOptions engine;
  size_t writer_buffer = 0;  // FastFileWriter io_buffer_bytes; 0: not part of this search
  bool operator==(const Candidate& o) const;
  std::string key() const;  // a stable text of every setting (to find it again)
};

struct Space {
  std::vector<Backend> backends;
  std::vector<size_t> block_sizes;
  std::vector<unsigned> queue_depths;
  std::vector<unsigned> parallelism;
  std::vector<bool> single_submit{false, true};
  std::vector<bool> overlap_events{false, true};
  std::vector<size_t> writer_buffers;  // empty: the staging size is not searched
};

struct Trial {
  Candidate candidate;
  std::vector<double> rates;  // GB/s, one per measurement
  double median() const;
};

struct Outcome {
  std::vector<Trial> ranked;  // best first (by median), every candidate measured
  size_t measurements = 0;
  bool out_of_budget = false;  // stopped by the budget rather than by running out of work
  double seconds = 0;
};

struct SearchOptions {
  double budget_seconds = 60;
  double prune_ratio = 0.7;
  double repeat_ratio = 0.9;
  unsigned repeats = 3;
  unsigned max_passes = 3;
};

// One timed measurement of a candidate: GB/s.
using Measure = std::function<Result<double>(const Candidate&)>;
// Called after every measurement: measurements so far, the candidate, its rate, and the
// fraction of the budget spent.
using Progress = std::function<void(size_t, const Candidate&, double, double)>;
// What time it is (a parameter so that tests can run a budget without waiting).
using Clock = std::function<std::chrono::steady_clock::time_point()>;

// Runs the search from `start` (its values need not be in `space`). A measurement's error
// ends the search with that error.
Result<Outcome> search(const Space& space, const Candidate& start, const SearchOptions& options,
                       const Measure& measure, const Progress& progress = {},
                       const Clock& clock = std::chrono::steady_clock::now);

// The line `tune` redraws on stderr after each measurement (through progress.h's StatusLine):
//   tune write [=======                 ] 12 measured, last 1.84 GB/s, best 2.10 GB/s
// `spent` is the fraction of the phase's budget used (the bar, full from 1 on), rates in GB/s.
std::string progress_line(std::string_view phase, size_t measured, double rate, double spent,
                          double best);

}  // namespace fastpersist::cli::tune
