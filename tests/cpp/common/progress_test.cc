// SPDX-License-Identifier: Apache-2.0
// The one progress bar (CLI verify, Python convert): its line, its redraw throttle, its final
// line, and that a FILE* (a pipe here) receives exactly what a sink does.
#include "common/progress.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace fastpersist {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

TEST(ProgressBarRender, DrawsSizesBarRateAndEta) {
  EXPECT_EQ(ProgressBar::render("verify step-00001000", static_cast<uint64_t>(1.2 * kGiB),
                                static_cast<uint64_t>(3.1 * kGiB), 0.8),
            "verify step-00001000  1.2 GiB / 3.1 GiB  [=========>              ]  1.5 GiB/s"
            "  ETA 0:02");
  // Complete: no ETA.
  EXPECT_EQ(ProgressBar::render("x", 10, 10, 2.0, 4), "x  10 B / 10 B  [====]  5 B/s");
}

TEST(ProgressBarRender, NothingDoneHasNoArrowNoRateAndAnEmptyTotalIsComplete) {
  EXPECT_EQ(ProgressBar::render("x", 0, 10, 1.0), "x  0 B / 10 B  [                        ]");
  EXPECT_EQ(ProgressBar::render("x", 0, 0, 0.0), "x  0 B / 0 B  [========================]");
  EXPECT_EQ(ProgressBar::render("x", 10, 10, 0.0, 4), "x  10 B / 10 B  [====]");
  // More done than the total (a total that grew late) stays a full bar.
  EXPECT_EQ(ProgressBar::render("x", 20, 10, 0.0, 4), "x  20 B / 10 B  [====]");
}

TEST(ProgressBarFormat, BytesAndEta) {
  std::vector<std::string> got;
  for (double n : {0.0, -1.0, 1023.0, 1024.0, 1536.0, 5.0 * kMiB, 2.5 * kGiB}) {
    got.push_back(format_bytes_short(n));
  }
  EXPECT_EQ(got, (std::vector<std::string>{"0 B", "0 B", "1023 B", "1.0 KiB", "1.5 KiB", "5.0 MiB",
                                           "2.5 GiB"}));
  EXPECT_EQ(format_eta(0), "0:00");
  EXPECT_EQ(format_eta(6.2), "0:07");
  EXPECT_EQ(format_eta(754), "12:34");
  EXPECT_EQ(format_eta(3723), "1:02:03");
  EXPECT_EQ(format_eta(-1), "?");
  EXPECT_EQ(format_eta(1e9), "?");
}

TEST(ProgressBar, RedrawsAtMostEveryIntervalAndEndsTheLine) {
  std::string out;
  {
    ProgressBar bar(
        "verify t", true, [&](std::string_view s) { out += s; }, 3600);
    for (uint64_t done = 0; done <= 100; done += 10) bar.update(done, 100);
    EXPECT_EQ(out, "\rverify t  0 B / 100 B  [                        ]");
    bar.finish();
    bar.finish();        // idempotent
    bar.update(5, 100);  // ignored once finished
  }
  ASSERT_EQ(out.back(), '\n');
  EXPECT_EQ(out.find('\n'), out.size() - 1);
  std::string final_frame = out.substr(out.rfind('\r') + 1);
  EXPECT_EQ(final_frame.rfind("verify t  100 B / 100 B  [========================]", 0), 0u)
      << final_frame;
}

TEST(ProgressBar, BlanksLeftoversOfALongerLineAndClearsOnFailure) {
  std::vector<std::string> frames;
  ProgressBar bar(
      "x", true, [&](std::string_view s) { frames.emplace_back(s); }, 0);
  bar.update(1023, 1024);  // "1023 B" ...
  bar.update(0, 0);        // ... then a shorter line: padded over the old one
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[1].size(), frames[0].size());
  // Clearing blanks the last line; what lay beyond it was blanked by that line's padding.
  bar.finish(/*clear=*/true);
  const size_t last = ProgressBar::render("x", 0, 0, 1.0).size();
  EXPECT_EQ(frames[1].substr(last + 1), std::string(frames[1].size() - last - 1, ' '));
  EXPECT_EQ(frames.back(), "\r" + std::string(last, ' ') + "\r");
}

TEST(ProgressBar, DisabledOrUndrawnBarsWriteNothing) {
  std::string out;
  {
    ProgressBar quiet("x", false, [&](std::string_view s) { out += s; });
    EXPECT_FALSE(quiet.enabled());
    quiet.update(1, 2);
  }
  {
    ProgressBar unused("x", true, [&](std::string_view s) { out += s; });
  }
  EXPECT_EQ(out, "");
  ProgressBar no_sink("x", true, ProgressBar::Sink{});
  EXPECT_FALSE(no_sink.enabled());
  ProgressBar no_file("x", true, static_cast<std::FILE*>(nullptr));
  EXPECT_FALSE(no_file.enabled());
}

TEST(ProgressBar, AFileReceivesWhatASinkReceives) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  std::FILE* w = ::fdopen(fds[1], "w");
  ASSERT_NE(w, nullptr);
  std::string expected;
  {
    ProgressBar file_bar("verify t", true, w, 0);
    ProgressBar sink_bar(
        "verify t", true, [&](std::string_view s) { expected += s; }, 0);
    for (uint64_t done : {0, 10, 100}) {
      file_bar.update(done, 100);
      sink_bar.update(done, 100);
    }
  }
  std::fclose(w);
  std::string got;
  char chunk[256];
  ssize_t n;
  while ((n = ::read(fds[0], chunk, sizeof(chunk))) > 0) got.append(chunk, static_cast<size_t>(n));
  ::close(fds[0]);
  // The frames differ only in the rate, which depends on when each bar drew.
  auto strip_rate = [](std::string s) {
    std::string out;
    for (size_t pos = 0; pos < s.size();) {
      size_t rate = s.find("]  ", pos);
      if (rate == std::string::npos) {
        out += s.substr(pos);
        break;
      }
      out += s.substr(pos, rate + 1 - pos);
      pos = s.find_first_of("\r\n", rate);
      if (pos == std::string::npos) break;
    }
    return out;
  };
  EXPECT_EQ(strip_rate(got), strip_rate(expected));
  EXPECT_EQ(std::count(got.begin(), got.end(), '\r'), 4);  // 3 updates and the final frame
}

TEST(ProgressBar, UpdatesFromManyThreadsDrawWholeFrames) {
  std::vector<std::string> frames;
  {
    ProgressBar bar(
        "x", true, [&](std::string_view s) { frames.emplace_back(s); }, 0);
    std::vector<std::thread> threads;
    for (uint64_t t = 0; t < 4; ++t) {
      threads.emplace_back([&bar, t] {
        for (uint64_t i = 0; i < 100; ++i) bar.update(t * 100 + i, 400);
      });
    }
    for (auto& th : threads) th.join();
  }
  ASSERT_FALSE(frames.empty());
  for (size_t i = 0; i + 1 < frames.size(); ++i) {
    EXPECT_EQ(frames[i].rfind("\rx  ", 0), 0u) << frames[i];
  }
  EXPECT_EQ(frames.back(), "\n");
}

}  // namespace
}  // namespace fastpersist
