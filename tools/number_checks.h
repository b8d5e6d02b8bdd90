// SPDX-License-Identifier: Apache-2.0
// Validators for numeric flags that CLI11's Range lets through: NaN (every comparison with it
// is false) and integers too large for their type (parsed with wrap-around or clamping). Each
// checks the text as the user typed it, before CLI11 converts it.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace fastpersist::cli {

// A finite decimal number in [min, max] ("nan", "inf", "1e400" and "5s" are refused).
CLI::Validator finite_in(double min, double max);
// A plain decimal integer in [min, max], with no sign but '-' for negatives, no exponent, no
// fraction, and no digits past what int64 holds.
CLI::Validator integer_in(int64_t min, int64_t max);

}  // namespace fastpersist::cli
