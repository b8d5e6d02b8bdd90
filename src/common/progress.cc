// SPDX-License-Identifier: Apache-2.0
#include "common/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <utility>

namespace fastpersist {
namespace {

std::string fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", digits, value);
  return text;
}

StatusLine::Sink file_sink(std::FILE* out) {
  if (out == nullptr) return {};
  return [out](std::string_view text) {
    std::fwrite(text.data(), 1, text.size(), out);
    std::fflush(out);
  };
}

}  // namespace

bool stderr_is_tty() { return ::isatty(STDERR_FILENO) == 1; }

std::string format_bytes_short(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (!(bytes > 0)) return "0 B";
  size_t unit = 0;
  while (unit + 1 < std::size(kUnits) && bytes >= 1024.0) {
    bytes /= 1024.0;
    ++unit;
  }
  if (unit == 0) return fixed(bytes, 0) + " B";
  return fixed(bytes, 1) + " " + kUnits[unit];
}

std::string format_eta(double seconds) {
  if (!(seconds >= 0) || seconds >= 100.0 * 3600) return "?";
  auto total = static_cast<uint64_t>(std::ceil(seconds));
  uint64_t hours = total / 3600, minutes = total / 60 % 60, secs = total % 60;
  char text[32];
  if (hours > 0) {
    std::snprintf(text, sizeof(text), "%llu:%02llu:%02llu", static_cast<unsigned long long>(hours),
                  static_cast<unsigned long long>(minutes), static_cast<unsigned long long>(secs));
  } else {
    std::snprintf(text, sizeof(text), "%llu:%02llu", static_cast<unsigned long long>(minutes),
                  static_cast<unsigned long long>(secs));
  }
  return text;
}

StatusLine::StatusLine(bool enabled, std::FILE* out) : StatusLine(enabled, file_sink(out)) {}

StatusLine::StatusLine(bool enabled, Sink sink)
    : enabled_(enabled && static_cast<bool>(sink)), sink_(std::move(sink)) {}

void StatusLine::draw(std::string_view text) {
  if (!enabled_) return;
  std::string frame = "\r" + std::string(text);
  if (text.size() < last_width_) frame += std::string(last_width_ - text.size(), ' ');
  last_width_ = text.size();
  drawn_ = true;
  sink_(frame);
}

void StatusLine::end_line() {
  if (!drawn_) return;  // nothing on the line: leave the terminal alone
  sink_("\n");
  last_width_ = 0;
  drawn_ = false;
}

void StatusLine::clear() {
  if (!drawn_) return;
  sink_("\r" + std::string(last_width_, ' ') + "\r");
  last_width_ = 0;
  drawn_ = false;
}

ProgressBar::ProgressBar(std::string label, bool enabled, std::FILE* out,
                         double min_interval_seconds)
    : ProgressBar(std::move(label), enabled, file_sink(out), min_interval_seconds) {}

ProgressBar::ProgressBar(std::string label, bool enabled, Sink sink, double min_interval_seconds)
    : label_(std::move(label)),
      line_(enabled, std::move(sink)),
      min_interval_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(std::max(min_interval_seconds, 0.0)))),
      start_(std::chrono::steady_clock::now()) {}

ProgressBar::~ProgressBar() { finish(); }

std::string ProgressBar::render(std::string_view label, uint64_t done, uint64_t total,
                                double seconds, int bar_width) {
  const double fraction =
      total == 0 ? 1.0
                 : std::clamp(static_cast<double>(done) / static_cast<double>(total), 0.0, 1.0);
  const int width = std::max(bar_width, 1);
  const int filled = static_cast<int>(std::floor(fraction * width));
  std::string bar(static_cast<size_t>(width), ' ');
  for (int i = 0; i < filled; ++i) bar[static_cast<size_t>(i)] = '=';
  if (filled < width && done > 0) bar[static_cast<size_t>(filled)] = '>';
  std::string text = std::string(label) + "  " + format_bytes_short(static_cast<double>(done)) +
                     " / " + format_bytes_short(static_cast<double>(total)) + "  [" + bar + "]";
  if (seconds > 0 && done > 0) {
    const double rate = static_cast<double>(done) / seconds;
    text += "  " + format_bytes_short(rate) + "/s";
    if (done < total) text += "  ETA " + format_eta(static_cast<double>(total - done) / rate);
  }
  return text;
}

void ProgressBar::update(uint64_t done, uint64_t total) {
  if (!enabled()) return;
  std::lock_guard lock(mu_);
  if (finished_) return;
  done_ = done;
  total_ = total;
  draw_locked(false);
}

void ProgressBar::draw_locked(bool force) {
  auto now = std::chrono::steady_clock::now();
  if (!force && line_.drawn() && now - last_draw_ < min_interval_) return;
  last_draw_ = now;
  line_.draw(render(label_, done_, total_, std::chrono::duration<double>(now - start_).count()));
}

void ProgressBar::finish(bool clear) {
  if (!enabled()) return;
  std::lock_guard lock(mu_);
  if (finished_) return;
  finished_ = true;
  if (!line_.drawn()) return;  // nothing on the line: leave the terminal alone
  if (clear) {
    line_.clear();
  } else {
    draw_locked(true);
    line_.end_line();
  }
}

}  // namespace fastpersist
