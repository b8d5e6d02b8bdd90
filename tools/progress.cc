// SPDX-License-Identifier: Apache-2.0
#include "progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "format.h"

namespace fastpersist::cli {

bool stderr_is_tty() { return ::isatty(STDERR_FILENO) == 1; }

std::string format_bytes_short(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (!(bytes > 0)) return "0 B";
  unsigned unit = 0;
  while (unit + 1 < std::size(kUnits) && bytes >= 1024.0) {
    bytes /= 1024.0;
    ++unit;
  }
  if (unit == 0) return format_fixed(bytes, 0) + " B";
  return format_fixed(bytes, 1) + " " + kUnits[unit];
}

ProgressBar::ProgressBar(std::string label, bool enabled, std::FILE* out,
                         double min_interval_seconds)
    : label_(std::move(label)),
      enabled_(enabled && out != nullptr),
      out_(out),
      min_interval_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(min_interval_seconds))),
      start_(std::chrono::steady_clock::now()) {}

ProgressBar::~ProgressBar() { finish(); }

std::string ProgressBar::render(const std::string& label, uint64_t done, uint64_t total,
                                double seconds, int bar_width) {
  const double fraction =
      total == 0 ? 1.0
                 : std::clamp(static_cast<double>(done) / static_cast<double>(total), 0.0, 1.0);
  const int width = std::max(bar_width, 1);
  const int filled = static_cast<int>(std::floor(fraction * width));
  std::string bar(static_cast<size_t>(width), ' ');
  for (int i = 0; i < filled; ++i) bar[static_cast<size_t>(i)] = '=';
  if (filled < width && done > 0) bar[static_cast<size_t>(filled)] = '>';
  std::string text = label + "  " + format_bytes_short(static_cast<double>(done)) + " / " +
                     format_bytes_short(static_cast<double>(total)) + "  [" + bar + "]";
  if (seconds > 0 && done > 0) {
    text += "  " + format_bytes_short(static_cast<double>(done) / seconds) + "/s";
  }
  return text;
}

void ProgressBar::update(uint64_t done, uint64_t total) {
  if (!enabled_) return;
  std::lock_guard lock(mu_);
  if (finished_) return;
  done_ = done;
  total_ = total;
  draw_locked(false);
}

void ProgressBar::draw_locked(bool force) {
  auto now = std::chrono::steady_clock::now();
  if (!force && drawn_ && now - last_draw_ < min_interval_) return;
  last_draw_ = now;
  drawn_ = true;
  std::string text =
      render(label_, done_, total_, std::chrono::duration<double>(now - start_).count());
  size_t width = text.size();
  if (width < last_width_) text += std::string(last_width_ - width, ' ');
  last_width_ = width;
  std::fputc('\r', out_);
  std::fputs(text.c_str(), out_);
  std::fflush(out_);
}

void ProgressBar::finish(bool clear) {
  if (!enabled_) return;
  std::lock_guard lock(mu_);
  if (finished_) return;
  finished_ = true;
  if (!drawn_) return;  // nothing on the line: leave the terminal alone
  if (clear) {
    std::fputc('\r', out_);
    std::fputs(std::string(last_width_, ' ').c_str(), out_);
    std::fputc('\r', out_);
  } else {
    draw_locked(true);
    std::fputc('\n', out_);
  }
  std::fflush(out_);
}

}  // namespace fastpersist::cli
