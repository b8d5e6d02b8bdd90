// SPDX-License-Identifier: Apache-2.0
// A one-line progress bar on stderr for long CLI operations (verify):
//
//   verify step-00001000  1.2 GiB / 3.1 GiB  [=========>          ]  1.5 GiB/s
//
// Redrawn in place with '\r', at most every `min_interval` seconds, so calling update() for
// every few MiB costs nothing measurable. Disabled bars do nothing, which lets callers create
// one unconditionally. Thread-safe: update() may be called from I/O callbacks on any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace fastpersist::cli {

class ProgressBar {
 public:
  ProgressBar(std::string label, bool enabled, std::FILE* out = stderr,
              double min_interval_seconds = 0.1);
  ~ProgressBar();  // finish()
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  bool enabled() const { return enabled_; }
  // `done` of `total` bytes; redraws when the interval passed (or on the first call).
  void update(uint64_t done, uint64_t total);
  // Draws the final state and ends the line; clears it instead with `clear`. Idempotent.
  void finish(bool clear = false);

  // The bar's text without the leading '\r' (tests and --progress output use the same).
  static std::string render(const std::string& label, uint64_t done, uint64_t total, double seconds,
                            int bar_width = 24);

 private:
  void draw_locked(bool force);

  std::string label_;
  bool enabled_;
  std::FILE* out_;
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

// True when stderr is a terminal (where a redrawn bar makes sense).
bool stderr_is_tty();

// "1.2 GiB": one decimal, binary units; steadier than format_bytes for text that is redrawn.
std::string format_bytes_short(double bytes);

}  // namespace fastpersist::cli
