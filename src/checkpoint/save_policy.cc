// SPDX-License-Identifier: Apache-2.0
// Young (1974): tau = sqrt(2 C M). Daly (2006), "A higher order estimate of the optimum
// checkpoint interval for restart dumps": for C < 2M,
//   tau = sqrt(2 C M) * (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C,  else tau = M.
#include "fastpersist/save_policy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

namespace fastpersist {
namespace {

bool positive(double v) { return std::isfinite(v) && v > 0; }

// Times beyond this are not times a training job has (about 31,700 years): refused, so that no
// product of two of them overflows and every figure of the advice stays finite.
constexpr double kMaxAdviceSeconds = 1e12;
// An interval of more steps than this is not a count of steps anybody runs (and would not fit
// the int64 it is reported in).
constexpr double kMaxAdviceSteps = 1e15;

std::string seconds_text(double v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g s", v);
  return text;
}

}  // namespace

Status SavePolicy::validate() const {
  if (every_steps && *every_steps < 1) {
    return Status(StatusCode::kInvalidArgument, "save_every_steps must be at least 1");
  }
  if (every_seconds && !positive(*every_seconds)) {
    return Status(StatusCode::kInvalidArgument,
                  "save_every_seconds must be a finite number above 0");
  }
  return Status::ok();
}

Result<IntervalAdvice> advise_interval(double checkpoint_seconds, double mtbf_seconds,
                                       std::optional<double> step_seconds, double restart_seconds) {
  auto bad = [](const std::string& what) { return Status(StatusCode::kInvalidArgument, what); };
  if (!positive(checkpoint_seconds))
    return bad("the checkpoint time must be a finite number of seconds above 0");
  if (!positive(mtbf_seconds))
    return bad("the mean time between failures must be a finite time above 0");
  if (step_seconds && !positive(*step_seconds))
    return bad("the step time must be a finite number of seconds above 0");
  if (!std::isfinite(restart_seconds) || restart_seconds < 0)
    return bad("the restart time must be >= 0");
  for (auto [value, what] : {std::pair{checkpoint_seconds, "checkpoint time"},
                             {mtbf_seconds, "mean time between failures"},
                             {step_seconds.value_or(1), "step time"},
                             {restart_seconds, "restart time"}}) {
    if (value > kMaxAdviceSeconds) {
      return bad(std::string("the ") + what + " of " + seconds_text(value) +
                 " is beyond any run (at most 1e+12 s)");
    }
  }
  const double c = checkpoint_seconds, m = mtbf_seconds;
  IntervalAdvice a;
  a.young_seconds = std::sqrt(2 * c * m);
  if (c < 2 * m) {
    const double x = c / (2 * m);
    a.interval_seconds = std::max(a.young_seconds * (1 + std::sqrt(x) / 3 + x / 9) - c, 0.0);
  } else {
    a.interval_seconds = m;
  }
  double tau = a.interval_seconds;
  if (step_seconds) {
    if (tau / *step_seconds > kMaxAdviceSteps) {
      return bad("the advised interval of " + seconds_text(tau) + " is more than 1e+15 steps of " +
                 seconds_text(*step_seconds) + ": the step time is too small for these times");
    }
    a.interval_steps = std::max<int64_t>(1, std::llround(tau / *step_seconds));
    tau = static_cast<double>(*a.interval_steps) * *step_seconds;
  }
  a.checkpoint_overhead = c / (tau + c);
  a.expected_loss = ((tau + c) / 2 + restart_seconds) / m;
  a.total_waste = a.checkpoint_overhead + a.expected_loss;
  for (double v : {a.young_seconds, a.interval_seconds, a.checkpoint_overhead, a.expected_loss,
                   a.total_waste}) {
    if (!std::isfinite(v))
      return Status(StatusCode::kInternal, "the interval advice came out non-finite");
  }
  return a;
}

}  // namespace fastpersist
