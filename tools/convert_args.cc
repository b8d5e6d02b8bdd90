// SPDX-License-Identifier: Apache-2.0
#include "convert_args.h"

#include <sstream>

#include "command.h"

namespace fastpersist::cli {

std::vector<std::string> ConvertArgs::to_argv() const {
  std::vector<std::string> argv;
  if (tag) argv.insert(argv.end(), {"--tag", *tag});
  if (prefix) argv.insert(argv.end(), {"--prefix", *prefix});
  if (compression) argv.insert(argv.end(), {"--compression", *compression});
  if (compression_level) {
    argv.insert(argv.end(), {"--compression-level", std::to_string(*compression_level)});
  }
  if (drop_non_tensors) argv.push_back("--drop-non-tensors");
  if (unsafe_pickle) argv.push_back("--unsafe-pickle");
  if (overwrite) argv.push_back("--overwrite");
  if (progress) argv.push_back("--progress");
  if (no_progress) argv.push_back("--no-progress");
  if (materialize) argv.push_back("--materialize");
  argv.insert(argv.end(), {"--", src});
  if (!dst.empty()) argv.push_back(dst);
  return argv;
}

void add_convert_options(CLI::App& app, ConvertArgs& args) {
  app.add_option("SRC", args.src,
                 "Torch file, .safetensors file, checkpoint directory, root (its latest), "
                 "torch.distributed.checkpoint directory, or DeepSpeed ZeRO checkpoint folder")
      ->required();
  app.add_option("DST", args.dst,
                 "*.safetensors, *.pt/.pth/.bin/.ckpt (torch format), or anything else: a new "
                 "checkpoint directory ROOT/TAG (required, except with --materialize)");
  app.add_option("--tag", args.tag,
                 "Checkpoint DST: DST is the root and TAG the new checkpoint's tag");
  app.add_option("--prefix", args.prefix,
                 "Only tensors whose name starts with PREFIX (e.g. 'model.'), stripped of it");
  app.add_option("--compression", args.compression,
                 "Checkpoint DST: store tensors compressed with zstd or lz4, or none (raw, plain "
                 "safetensors files; the default): compresses or decompresses a checkpoint")
      ->check(CLI::IsMember({"none", "zstd", "lz4"}));
  app.add_option("--compression-level", args.compression_level,
                 "Checkpoint DST: the codec's level (zstd: 1 by default, up to 22; lz4: 0..12)");
  app.add_flag("--drop-non-tensors", args.drop_non_tensors,
               "Safetensors DST: leave out non-tensor values instead of failing");
  app.add_flag("--unsafe-pickle", args.unsafe_pickle,
               "Load torch files, checkpoint objects and the pickles of DCP and DeepSpeed "
               "checkpoints with weights_only=False (runs arbitrary pickled code: only for "
               "files you trust)");
  app.add_flag("--overwrite", args.overwrite, "Replace an existing DST file");
  app.add_flag("--materialize", args.materialize,
               "SRC is an incremental checkpoint: copy the base files it references into it, "
               "in place (no DST), so that it no longer depends on its base");
  CLI::Option* progress =
      app.add_flag("--progress", args.progress,
                   "Show a progress bar on stderr (default: when stderr is a terminal)");
  app.add_flag("--no-progress", args.no_progress, "Never show the progress bar")
      ->excludes(progress);
}

std::string convert_usage_error(const ConvertArgs& a) {
  if (!a.materialize) {
    return a.dst.empty() ? "DST is required (or --materialize CKPT)" : "";
  }
  if (!a.dst.empty()) return "--materialize works in place: give the checkpoint only, no DST";
  if (a.tag || a.prefix || a.compression || a.compression_level || a.drop_non_tensors ||
      a.unsafe_pickle || a.overwrite) {
    return "--materialize takes no other option";
  }
  return "";
}

ConvertParse parse_convert_args(const std::vector<std::string>& argv, const std::string& prog) {
  ConvertArgs args;
  CLI::App app{
      "Convert between torch files (.pt/.pth/.bin/.ckpt), .safetensors files and fastpersist "
      "checkpoint directories; import torch.distributed.checkpoint directories and DeepSpeed "
      "ZeRO checkpoint folders",
      prog};
  add_convert_options(app, args);
  app.footer("Exit status: 0 done, 1 failed, 2 bad arguments.");
  ConvertParse outcome;
  try {
    // CLI11 takes a vector in reverse order (it pops arguments off the back).
    std::vector<std::string> reversed(argv.rbegin(), argv.rend());
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    std::ostringstream out;
    std::ostringstream err;
    outcome.exit_code = app.exit(e, out, err) == 0 ? kExitOk : kExitUsage;
    outcome.out = out.str();
    outcome.err = err.str();
    return outcome;
  }
  if (std::string problem = convert_usage_error(args); !problem.empty()) {
    outcome.exit_code = kExitUsage;
    outcome.err = prog + ": error: " + problem + "\n";
    return outcome;
  }
  outcome.args = std::move(args);
  return outcome;
}

}  // namespace fastpersist::cli
