// SPDX-License-Identifier: Apache-2.0
// `convert`'s one parser (tools/convert_args.h): what the CLI hands to Python parses back to the
// same arguments, and bad command lines get the same answers on both sides.
#include "convert_args.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace fastpersist::cli {
namespace {

constexpr const char* kProg = "python -m fastpersist.convert";

ConvertParse parse(const std::vector<std::string>& argv) { return parse_convert_args(argv, kProg); }

void expect_same(const ConvertArgs& a, const ConvertArgs& b) {
  EXPECT_EQ(a.src, b.src);
  EXPECT_EQ(a.dst, b.dst);
  EXPECT_EQ(a.tag, b.tag);
  EXPECT_EQ(a.prefix, b.prefix);
  EXPECT_EQ(a.compression, b.compression);
  EXPECT_EQ(a.compression_level, b.compression_level);
  EXPECT_EQ(a.drop_non_tensors, b.drop_non_tensors);
  EXPECT_EQ(a.unsafe_pickle, b.unsafe_pickle);
  EXPECT_EQ(a.overwrite, b.overwrite);
  EXPECT_EQ(a.progress, b.progress);
  EXPECT_EQ(a.no_progress, b.no_progress);
  EXPECT_EQ(a.materialize, b.materialize);
}

TEST(ConvertArgs, EveryOptionParsesAndSurvivesTheHandOverToPython) {
  ConvertParse first =
      parse({"in.pt", "out", "--tag", "step-7", "--prefix", "model.", "--compression", "zstd",
             "--compression-level", "3", "--drop-non-tensors", "--unsafe-pickle", "--overwrite",
             "--no-progress"});
  ASSERT_TRUE(first.args.has_value()) << first.err;
  const ConvertArgs& a = *first.args;
  EXPECT_EQ(a.src, "in.pt");
  EXPECT_EQ(a.dst, "out");
  EXPECT_EQ(a.tag, "step-7");
  EXPECT_EQ(a.prefix, "model.");
  EXPECT_EQ(a.compression, "zstd");
  EXPECT_EQ(a.compression_level, 3);
  EXPECT_TRUE(a.drop_non_tensors && a.unsafe_pickle && a.overwrite && a.no_progress);
  EXPECT_FALSE(a.progress || a.materialize);
  ConvertParse again = parse(a.to_argv());
  ASSERT_TRUE(again.args.has_value()) << again.err;
  expect_same(a, *again.args);
}

TEST(ConvertArgs, PathsThatLookLikeOptionsStayPaths) {
  ConvertParse first = parse({"--progress", "--", "-in.pt", "--out.safetensors"});
  ASSERT_TRUE(first.args.has_value()) << first.err;
  EXPECT_EQ(first.args->src, "-in.pt");
  EXPECT_EQ(first.args->dst, "--out.safetensors");
  ConvertParse again = parse(first.args->to_argv());
  ASSERT_TRUE(again.args.has_value()) << again.err;
  expect_same(*first.args, *again.args);
}

TEST(ConvertArgs, MaterializeTakesTheCheckpointAlone) {
  ConvertParse ok = parse({"--materialize", "root/step-3"});
  ASSERT_TRUE(ok.args.has_value()) << ok.err;
  EXPECT_TRUE(ok.args->materialize);
  EXPECT_EQ(ok.args->dst, "");
  ConvertParse again = parse(ok.args->to_argv());
  ASSERT_TRUE(again.args.has_value()) << again.err;
  expect_same(*ok.args, *again.args);

  ConvertParse with_dst = parse({"--materialize", "root/step-3", "out"});
  EXPECT_FALSE(with_dst.args.has_value());
  EXPECT_EQ(with_dst.exit_code, 2);
  EXPECT_EQ(with_dst.err, std::string(kProg) +
                              ": error: --materialize works in place: give the checkpoint only, "
                              "no DST\n");
  ConvertParse with_tag = parse({"--materialize", "--tag", "t", "root/step-3"});
  EXPECT_EQ(with_tag.exit_code, 2);
  EXPECT_EQ(with_tag.err, std::string(kProg) + ": error: --materialize takes no other option\n");
}

TEST(ConvertArgs, BadCommandLinesAreUsageErrorsThatSayWhy) {
  ConvertParse no_dst = parse({"in.pt"});
  EXPECT_FALSE(no_dst.args.has_value());
  EXPECT_EQ(no_dst.exit_code, 2);
  EXPECT_EQ(no_dst.err, std::string(kProg) + ": error: DST is required (or --materialize CKPT)\n");
  EXPECT_EQ(no_dst.out, "");

  ConvertParse both = parse({"in.pt", "out.safetensors", "--progress", "--no-progress"});
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.err.find("excludes"), std::string::npos) << both.err;

  ConvertParse codec = parse({"in.pt", "out", "--compression", "gzip"});
  EXPECT_EQ(codec.exit_code, 2);
  EXPECT_NE(codec.err.find("gzip"), std::string::npos) << codec.err;

  ConvertParse level = parse({"in.pt", "out", "--compression-level", "high"});
  EXPECT_EQ(level.exit_code, 2);
  EXPECT_NE(level.err.find("high"), std::string::npos) << level.err;

  ConvertParse unknown = parse({"in.pt", "out", "--fast"});
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.err.find("--fast"), std::string::npos) << unknown.err;

  EXPECT_EQ(parse({}).exit_code, 2);
}

TEST(ConvertArgs, HelpNamesTheProgramAndEveryOption) {
  ConvertParse help = parse({"--help"});
  EXPECT_FALSE(help.args.has_value());
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_EQ(help.err, "");
  for (const char* word : {kProg, "SRC", "DST", "--tag", "--prefix", "--compression",
                           "--compression-level", "--drop-non-tensors", "--unsafe-pickle",
                           "--overwrite", "--materialize", "--progress", "--no-progress"}) {
    EXPECT_NE(help.out.find(word), std::string::npos) << word;
  }
}

}  // namespace
}  // namespace fastpersist::cli
