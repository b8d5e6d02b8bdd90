// SPDX-License-Identifier: Apache-2.0
// The one progress bar of fastpersist (private to the library, its CLI and its Python package:
// not installed): the CLI (verify) and the Python package (convert, through
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
// The redrawing itself is StatusLine's, the one writer of '\r' lines: the bar draws through it,
// and so does any other line redrawn in place (`fastpersist tune` shows its search on one).
//
// Thread-safety: update() and finish() may be called from any thread (I/O callbacks); the sink
// is called under the bar's mutex, one whole frame per call. A StatusLine is not thread-safe:
// its owner serializes the calls (ProgressBar holds its mutex around them).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>

namespace fastpersist {

// A line of text redrawn in place: each draw() writes "\r" and the new text, padded with blanks
// over what a longer previous text left; end_line() ends the line, clear() blanks it and puts the
// cursor back at its start (the next draw() redraws the same line). A disabled line (or one
// without a sink) writes nothing; neither end_line() nor clear() writes anything before a draw().
class StatusLine {
 public:
  // Receives the text to write, a frame ("\r" + line) or a line end, and flushes it.
  using Sink = std::function<void(std::string_view)>;

  // Draws into `out` (stderr by default); nullptr disables the line.
  explicit StatusLine(bool enabled, std::FILE* out = stderr);
  // Draws through `sink` (an empty sink disables the line).
  StatusLine(bool enabled, Sink sink);

  bool enabled() const { return enabled_; }
  // True from a draw() to the next end_line() or clear().
  bool drawn() const { return drawn_; }
  // Replaces the line's text with `text` (one line: no '\r' or '\n').
  void draw(std::string_view text);
  // Ends the line ("\n") when one was drawn: the text stays on screen.
  void end_line();
  // Blanks the line when one was drawn, leaving the cursor at its start.
  void clear();

 private:
  bool enabled_;
  Sink sink_;
  size_t last_width_ = 0;  // characters drawn last time, to blank leftovers
  bool drawn_ = false;
};

class ProgressBar {
 public:
  using Sink = StatusLine::Sink;

  // Draws into `out` (stderr by default); nullptr disables the bar.
  ProgressBar(std::string label, bool enabled, std::FILE* out = stderr,
              double min_interval_seconds = 0.1);
  // Draws through `sink` (an empty sink disables the bar).
  ProgressBar(std::string label, bool enabled, Sink sink, double min_interval_seconds = 0.1);
  ~ProgressBar();  // finish()
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  bool enabled() const { return line_.enabled(); }
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
  StatusLine line_;
  std::chrono::steady_clock::duration min_interval_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_{};
  std::mutex mu_;
  uint64_t done_ = 0;
  uint64_t total_ = 0;
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
