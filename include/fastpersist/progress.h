// SPDX-License-Identifier: Apache-2.0
// The one progress bar of fastpersist: the CLI (verify) and the Python package (convert, through
// `_core.ProgressBar`) both draw this line, so they cannot drift apart:
//
//   verify step-00001000  1.2 GiB / 3.1 GiB  [=========>              ]  1.5 GiB/s  ETA 0:02
//
// Rules: the line is redrawn in place with '\r', at most every `min_interval_seconds` (the first
// update always draws), so calling update() for every few MiB costs nothing measurable; a line
// shorter than the previous one is padded with blanks over the leftovers; finish() draws the
// final state and ends the line, or blanks it (`clear`, when the operation failed and an error
// message follows). The rate appears once bytes are done, the ETA only while the bar is not full.
// A disabled bar writes nothing, which lets callers create one unconditionally; whether to
// enable it is the caller's decision (`--progress` / `--no-progress`, else stderr_is_tty()).
//
// Thread-safety: update() and finish() may be called from any thread (I/O callbacks); the sink
// is called under the bar's mutex, one whole frame per call.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>

namespace fastpersist {

class ProgressBar {
 public:
  // Receives the text to write, a frame ("\r" + line) or a line end, and flushes it.
  using Sink = std::function<void(std::string_view)>;

  // Draws into `out` (stderr by default); nullptr disables the bar.
  ProgressBar(std::string label, bool enabled, std::FILE* out = stderr,
              double min_interval_seconds = 0.1);
  // Draws through `sink` (an empty sink disables the bar).
  ProgressBar(std::string label, bool enabled, Sink sink, double min_interval_seconds = 0.1);
  ~ProgressBar();  // finish()
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  bool enabled() const { return enabled_; }
  // `done` of `total` bytes; redraws when the interval passed (or on the first call). Ignored
  // once finished.
  void update(uint64_t done, uint64_t total);
  // Draws the final state and ends the line; blanks it instead with `clear`. Does nothing when
  // nothing was drawn (the terminal is left alone). Idempotent.
  void finish(bool clear = false);

  // The bar's text without the leading '\r', for `done` of `total` bytes after `seconds`.
  static std::string render(std::string_view label, uint64_t done, uint64_t total, double seconds,
                            int bar_width = 24);

 private:
  void draw_locked(bool force);

  std::string label_;
  bool enabled_;
  Sink sink_;
  std::chrono::steady_clock::duration min_interval_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_{};
  std::mutex mu_;
  uint64_t done_ = 0;
  uint64_t total_ = 0;
  size_t last_width_ = 0;  // characters drawn last time, to blank leftovers
  bool drawn_ = false;
  bool finished_ = false;
};

// True when stderr (file descriptor 2) is a terminal, where a redrawn bar makes sense.
bool stderr_is_tty();

// "1.2 GiB": one decimal, binary units ("1023 B" below 1 KiB); steadier than two decimals for
// text that is redrawn. "0 B" for zero, negative or NaN.
std::string format_bytes_short(double bytes);

// "0:07", "12:34", "1:02:03": the remaining time of a bar; "?" when unknown (negative, NaN or
// beyond 100 hours).
std::string format_eta(double seconds);

}  // namespace fastpersist
