// SPDX-License-Identifier: Apache-2.0
#include "tune_search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <utility>

namespace fastpersist::cli::tune {

bool Candidate::operator==(const Candidate& o) const { return key() == o.key(); }

std::string Candidate::key() const {
  return std::string(backend_name(engine.backend)) + "/" + std::to_string(engine.block_size) + "/" +
         std::to_string(engine.queue_depth) + "/" + std::to_string(engine.intra_op_parallelism) +
         "/" + (engine.single_submit ? "1" : "0") + (engine.overlap_events ? "1" : "0") +
         (engine.direct_io ? "1" : "0") + "/" + std::to_string(writer_buffer);
}

double Trial::median() const {
  if (rates.empty()) return 0;
  std::vector<double> r = rates;
  std::sort(r.begin(), r.end());
  const size_t n = r.size();
  return n % 2 == 1 ? r[n / 2] : (r[n / 2 - 1] + r[n / 2]) / 2;
}

namespace {

// One setting the search varies: how many values it has, whether they are ordered (a scan may
// stop early), how to set value i, and which value a candidate has (nullopt: none of them).
struct Dimension {
  size_t count = 0;
  bool ordered = false;
  std::function<void(Candidate&, size_t)> set;
  std::function<std::optional<size_t>(const Candidate&)> index_of;
};

template <typename T, typename Get, typename Put>
Dimension dimension(const std::vector<T>& values, bool ordered, Get get, Put put) {
  Dimension d;
  d.count = values.size();
  d.ordered = ordered;
  d.set = [values, put](Candidate& c, size_t i) { put(c, values[i]); };
  d.index_of = [values, get](const Candidate& c) -> std::optional<size_t> {
    auto it = std::find(values.begin(), values.end(), get(c));
    if (it == values.end()) return std::nullopt;
    return static_cast<size_t>(it - values.begin());
  };
  return d;
}

std::vector<Dimension> dimensions(const Space& s) {
  std::vector<Dimension> dims;
  auto add = [&dims](Dimension d) {
    if (d.count > 0) dims.push_back(std::move(d));
  };
  // std::vector<bool> hands out no bool&: flags go through plain chars.
  auto flags = [](const std::vector<bool>& v) { return std::vector<char>(v.begin(), v.end()); };
  add(dimension(
      s.backends, false, [](const Candidate& c) { return c.engine.backend; },
      [](Candidate& c, Backend v) { c.engine.backend = v; }));
  add(dimension(
      s.block_sizes, true, [](const Candidate& c) { return c.engine.block_size; },
      [](Candidate& c, size_t v) { c.engine.block_size = v; }));
  add(dimension(
      s.queue_depths, true, [](const Candidate& c) { return c.engine.queue_depth; },
      [](Candidate& c, unsigned v) { c.engine.queue_depth = v; }));
  add(dimension(
      s.parallelism, true, [](const Candidate& c) { return c.engine.intra_op_parallelism; },
      [](Candidate& c, unsigned v) { c.engine.intra_op_parallelism = v; }));
  add(dimension(
      flags(s.single_submit), false,
      [](const Candidate& c) { return static_cast<char>(c.engine.single_submit); },
      [](Candidate& c, char v) { c.engine.single_submit = v != 0; }));
  add(dimension(
      flags(s.overlap_events), false,
      [](const Candidate& c) { return static_cast<char>(c.engine.overlap_events); },
      [](Candidate& c, char v) { c.engine.overlap_events = v != 0; }));
  add(dimension(
      s.writer_buffers, true, [](const Candidate& c) { return c.writer_buffer; },
      [](Candidate& c, size_t v) { c.writer_buffer = v; }));
  return dims;
}

class Searcher {
 public:
  Searcher(const SearchOptions& o, const Measure& m, const Progress& p, const Clock& clock)
      : o_(o), measure_(m), progress_(p), clock_(clock), start_(clock()) {}

  bool time_left() const { return measurements_ == 0 || elapsed() < o_.budget_seconds; }
  double elapsed() const { return std::chrono::duration<double>(clock_() - start_).count(); }

  // The candidate's rate: measured now when it never was (and time is left).
  Result<std::optional<double>> rate(const Candidate& c) {
    auto it = index_.find(c.key());
    if (it != index_.end()) return std::optional<double>(trials_[it->second].median());
    if (!time_left()) {
      out_of_budget_ = true;
      return std::optional<double>();
    }
    index_[c.key()] = trials_.size();
    trials_.push_back({c, {}});
    FP_RETURN_IF_ERROR(measure_once(trials_.size() - 1));
    return std::optional<double>(trials_.back().median());
  }

  Status measure_once(size_t trial) {
    FP_ASSIGN_OR_RETURN(double r, measure_(trials_[trial].candidate));
    trials_[trial].rates.push_back(r);
    ++measurements_;
    if (progress_) {
      progress_(measurements_, trials_[trial].candidate, r,
                std::min(1.0, elapsed() / std::max(o_.budget_seconds, 1e-9)));
    }
    return Status::ok();
  }

  // Index of the best trial so far (by median).
  size_t best() const {
    size_t b = 0;
    for (size_t i = 1; i < trials_.size(); ++i) {
      if (trials_[i].median() > trials_[b].median()) b = i;
    }
    return b;
  }

  // Varies one dimension around the best candidate.
  Status scan(const Dimension& d) {
    const Candidate base = trials_[best()].candidate;
    auto try_value = [&](size_t i) -> Result<std::optional<double>> {
      Candidate c = base;
      d.set(c, i);
      return rate(c);
    };
    std::optional<size_t> at = d.index_of(base);
    if (!d.ordered || !at) {
      for (size_t i = 0; i < d.count; ++i) FP_RETURN_IF_ERROR(try_value(i).status());
      return Status::ok();
    }
    for (int step : {+1, -1}) {
      int bad = 0;
      for (long i = static_cast<long>(*at) + step; i >= 0 && i < static_cast<long>(d.count);
           i += step) {
        FP_ASSIGN_OR_RETURN(std::optional<double> r, try_value(static_cast<size_t>(i)));
        if (!r) return Status::ok();  // out of budget
        const double best_rate = trials_[best()].median();
        bad = *r < o_.prune_ratio * best_rate ? bad + 1 : 0;
        if (bad >= 2) break;
      }
    }
    return Status::ok();
  }

  Status repeat_contenders() {
    const double best_rate = trials_[best()].median();
    std::vector<size_t> contenders;
    for (size_t i = 0; i < trials_.size(); ++i) {
      if (trials_[i].median() >= o_.repeat_ratio * best_rate) contenders.push_back(i);
    }
    std::sort(contenders.begin(), contenders.end(),
              [this](size_t a, size_t b) { return trials_[a].median() > trials_[b].median(); });
    if (contenders.size() > 5) contenders.resize(5);
    for (bool more = true; more;) {
      more = false;
      for (size_t i : contenders) {
        if (trials_[i].rates.size() >= o_.repeats) continue;
        if (!time_left()) {
          out_of_budget_ = true;
          return Status::ok();
        }
        FP_RETURN_IF_ERROR(measure_once(i));
        more = true;
      }
    }
    return Status::ok();
  }

  Outcome outcome() const {
    Outcome out;
    out.ranked = trials_;
    std::stable_sort(out.ranked.begin(), out.ranked.end(),
                     [](const Trial& a, const Trial& b) { return a.median() > b.median(); });
    out.measurements = measurements_;
    out.out_of_budget = out_of_budget_;
    out.seconds = elapsed();
    return out;
  }

 private:
  const SearchOptions& o_;
  const Measure& measure_;
  const Progress& progress_;
  const Clock& clock_;
  const std::chrono::steady_clock::time_point start_;
  std::vector<Trial> trials_;
  std::map<std::string, size_t> index_;
  size_t measurements_ = 0;
  bool out_of_budget_ = false;
};

}  // namespace

Result<Outcome> search(const Space& space, const Candidate& start, const SearchOptions& options,
                       const Measure& measure, const Progress& progress, const Clock& clock) {
  Searcher s(options, measure, progress, clock);
  FP_RETURN_IF_ERROR(s.rate(start).status());
  const std::vector<Dimension> dims = dimensions(space);
  for (unsigned pass = 0; pass < std::max(1u, options.max_passes) && s.time_left(); ++pass) {
    const std::string before = s.outcome().ranked.front().candidate.key();
    for (const Dimension& d : dims) {
      if (!s.time_left()) break;
      FP_RETURN_IF_ERROR(s.scan(d));
    }
    if (s.outcome().ranked.front().candidate.key() == before) break;  // nothing moved: done
  }
  FP_RETURN_IF_ERROR(s.repeat_contenders());
  return s.outcome();
}

std::string progress_line(std::string_view phase, size_t measured, double rate, double spent,
                          double best) {
  constexpr int kWidth = 24;
  const int filled = static_cast<int>(std::lround(spent * kWidth));
  std::string bar(static_cast<size_t>(std::clamp(filled, 0, kWidth)), '=');
  bar.resize(kWidth, ' ');
  auto gb_per_s = [](double value) {
    char text[64];
    std::snprintf(text, sizeof(text), "%.2f GB/s", value);
    return std::string(text);
  };
  return "tune " + std::string(phase) + " [" + bar + "] " + std::to_string(measured) +
         " measured, last " + gb_per_s(rate) + ", best " + gb_per_s(best);
}

}  // namespace fastpersist::cli::tune
