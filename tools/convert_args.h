// SPDX-License-Identifier: Apache-2.0
// `convert`'s command line, declared once. The CLI's subcommand (convert_command.cc) and
// `python -m fastpersist.convert` (fastpersist/convert.py, through _core.parse_convert_args)
// parse the same declaration, so they take the same command lines and answer bad ones with the
// same messages. The CLI hands a parsed command line to Python as to_argv(), which this parser
// reads back to the same ConvertArgs.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

namespace fastpersist::cli {

struct ConvertArgs {
  std::string src;
  std::string dst;  // empty with --materialize
  std::optional<std::string> tag;
  std::optional<std::string> prefix;
  std::optional<std::string> compression;  // "none", "zstd" or "lz4"
  std::optional<int> compression_level;
  bool drop_non_tensors = false;
  bool unsafe_pickle = false;
  bool overwrite = false;
  // Neither: a progress bar when stderr is a terminal. Never both (the parser refuses it).
  bool progress = false;
  bool no_progress = false;
  bool materialize = false;

  // The command line that parses back to these arguments: options first, then "--", SRC and
  // DST (so that a path starting with '-' stays a path).
  std::vector<std::string> to_argv() const;
};

// Declares SRC, DST and every option of `convert` on `app`, storing into `args`, which must
// outlive the parse.
void add_convert_options(CLI::App& app, ConvertArgs& args);

// What a parsed command line breaks that no single option can say (DST is required unless
// --materialize, which takes nothing else); empty when it breaks nothing. A usage error.
std::string convert_usage_error(const ConvertArgs& args);

// The outcome of parse_convert_args.
struct ConvertParse {
  std::optional<ConvertArgs> args;  // set when there is a conversion to run
  int exit_code = 0;                // without args: 0 after --help, 2 for a bad command line
  std::string out;                  // without args: the help text, for stdout
  std::string err;                  // without args: the error message, for stderr
};

// Parses `argv` (without the program's name) as `convert`'s command line, naming `prog` in the
// help text and in error messages ("PROG: error: ...").
ConvertParse parse_convert_args(const std::vector<std::string>& argv, const std::string& prog);

}  // namespace fastpersist::cli
