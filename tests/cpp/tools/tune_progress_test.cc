// SPDX-License-Identifier: Apache-2.0
// The line `fastpersist tune` redraws on stderr (tools/tune_search.h: progress_line), drawn
// through the library's StatusLine (src/common/progress.h) as the command draws it: a frame per
// measurement, padded over a longer previous one, blanked after each phase, nothing when off.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/progress.h"
#include "tune_search.h"

namespace fastpersist::cli::tune {
namespace {

TEST(TuneProgressLine, ShowsPhaseBudgetBarCountAndRates) {
  EXPECT_EQ(progress_line("write", 12, 1.844, 0.3, 2.1),
            "tune write [=======                 ] 12 measured, last 1.84 GB/s, best 2.10 GB/s");
  // The bar is the share of the budget spent: empty before, full from the whole budget on.
  EXPECT_EQ(progress_line("read", 1, 0, -0.5, 0),
            "tune read [                        ] 1 measured, last 0.00 GB/s, best 0.00 GB/s");
  EXPECT_EQ(progress_line("writer staging", 40, 3, 1.7, 3.25),
            "tune writer staging [========================] 40 measured, last 3.00 GB/s, best "
            "3.25 GB/s");
}

TEST(TuneProgressLine, RedrawsInPlaceAndIsBlankedAfterEachPhase) {
  std::vector<std::string> frames;
  StatusLine line(true, [&](std::string_view s) { frames.emplace_back(s); });
  const std::string longer = progress_line("write", 9, 10.5, 0.5, 10.5);
  const std::string shorter = progress_line("write", 3, 1, 0.6, 10.5);
  ASSERT_GT(longer.size(), shorter.size());
  line.draw(longer);
  line.draw(shorter);
  line.clear();
  line.clear();        // nothing left to blank
  line.draw(shorter);  // the next phase starts on the blanked line
  EXPECT_EQ(frames, (std::vector<std::string>{
                        "\r" + longer,
                        "\r" + shorter + std::string(longer.size() - shorter.size(), ' '),
                        "\r" + std::string(shorter.size(), ' ') + "\r",
                        "\r" + shorter,
                    }));
  line.end_line();
  EXPECT_EQ(frames.back(), "\n");
  EXPECT_FALSE(line.drawn());
}

TEST(TuneProgressLine, DisabledLineWritesNothing) {
  std::string out;
  StatusLine off(false, [&](std::string_view s) { out += s; });
  EXPECT_FALSE(off.enabled());
  off.draw(progress_line("write", 1, 1, 0.1, 1));
  off.clear();
  off.end_line();
  StatusLine no_sink(true, StatusLine::Sink{});
  EXPECT_FALSE(no_sink.enabled());
  no_sink.draw("x");
  EXPECT_EQ(out, "");
  EXPECT_FALSE(StatusLine(true, static_cast<std::FILE*>(nullptr)).enabled());
}

}  // namespace
}  // namespace fastpersist::cli::tune
