// SPDX-License-Identifier: Apache-2.0
// When to save (docs/tiers.md, "Save policy and interval"): a periodic policy the manager
// applies (CheckpointManager::should_save), and the interval that minimizes the expected cost
// of failures plus checkpoints (advise_interval, `fastpersist advise`).
#pragma once

#include <cstdint>
#include <optional>

#include "fastpersist/status.h"

namespace fastpersist {

// Save when `every_steps` steps have passed since the last save (the step is a multiple of it),
// or when `every_seconds` seconds have passed since the last save (or since the manager
// opened), whichever comes first. Neither: no policy.
struct SavePolicy {
  std::optional<int64_t> every_steps;
  std::optional<double> every_seconds;

  bool empty() const { return !every_steps && !every_seconds; }
  // kInvalidArgument: every_steps below 1, every_seconds not finite or not above 0.
  Status validate() const;
};

// Young's and Daly's checkpoint intervals for a checkpoint that costs `checkpoint_seconds` of
// training time (what a save blocks) and a mean time between failures of `mtbf_seconds`,
// restarts costing `restart_seconds` each. The interval is the compute time between two saves.
struct IntervalAdvice {
  double young_seconds = 0;     // sqrt(2 C M)
  double interval_seconds = 0;  // Daly's higher-order estimate (M when C >= 2M), the advice
  std::optional<int64_t> interval_steps;  // with a step time: the advice in whole steps (>= 1)
  // Fractions of wall time at the advised interval (in steps when given): checkpoint overhead
  // C / (tau + C), the expected loss to failures ((tau + C) / 2 + R) / M, and their sum.
  double checkpoint_overhead = 0;
  double expected_loss = 0;
  double total_waste = 0;
};

// kInvalidArgument for a time that is not finite and positive (restart: not negative), above
// 1e12 s, or a step time so small that the interval would be more than 1e15 steps. Every
// figure of the advice is finite.
Result<IntervalAdvice> advise_interval(double checkpoint_seconds, double mtbf_seconds,
                                       std::optional<double> step_seconds = std::nullopt,
                                       double restart_seconds = 0);

}  // namespace fastpersist
