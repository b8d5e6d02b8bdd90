// SPDX-License-Identifier: Apache-2.0
// `fastpersist convert SRC DST`: torch files (.pt/.pth/.bin) <-> .safetensors <-> checkpoint
// directories, and imports of torch.distributed.checkpoint and DeepSpeed ZeRO folders. Reading
// and writing torch pickles needs torch, so this command runs Python:
//
//   <python> -c <bootstrap> [options] -- SRC DST      (the bootstrap runs fastpersist.convert)
//
// which is `python -m fastpersist.convert` with a clear message when fastpersist (or torch) is
// missing from that Python (which Python: python_exec.h). The process is replaced (exec), so the
// exit status, signals and terminal are Python's: 0 done, 1 failed, 2 bad arguments. Python draws
// the progress bar from the bytes it reads and writes through `_core.ProgressBar`, verify's bar
// (fastpersist/progress.h).

#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/root_scan.h"
#include "checkpoint_paths.h"
#include "command.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/manifest.h"
#include "fastpersist/options.h"
#include "python_exec.h"

namespace fastpersist::cli {
namespace {

constexpr const char* kCommand = "convert";

constexpr const char* kBootstrap =
    "import sys\n"
    "try:\n"
    "    from fastpersist.convert import main\n"
    "except ImportError as e:\n"
    "    sys.stderr.write(\n"
    "        'fastpersist convert: error: the Python at %s cannot import fastpersist.convert '\n"
    "        '(%s); install fastpersist and torch into it, or set FASTPERSIST_PYTHON to a '\n"
    "        'Python that has them\\n' % (sys.executable, e))\n"
    "    sys.exit(1)\n"
    "sys.exit(main(sys.argv[1:], prog='fastpersist convert'))\n";

struct Args {
  std::string src;
  std::string dst;
  std::optional<std::string> tag;
  std::optional<std::string> prefix;
  std::optional<std::string> compression;
  std::optional<int> compression_level;
  bool drop_non_tensors = false;
  bool unsafe_pickle = false;
  bool overwrite = false;
  bool progress = false;
  bool no_progress = false;
  bool materialize = false;
};

// `convert --materialize CKPT`: in place, in C++ (no Python): the incremental checkpoint's
// referenced base files are copied into it and its manifest replaced (checkpoint/materialize.h),
// through a CheckpointManager of its root, so the root's lock keeps a training job out.
int run_materialize(const Args& a) {
  if (!a.dst.empty()) {
    return fail(kCommand, "--materialize works in place: give the checkpoint only, no DST",
                kExitUsage);
  }
  if (a.tag || a.prefix || a.compression || a.compression_level || a.drop_non_tensors ||
      a.unsafe_pickle || a.overwrite) {
    return fail(kCommand, "--materialize takes no other option", kExitUsage);
  }
  PathInfo p = classify_path(a.src);
  if (p.kind == PathKind::kMissing) return fail(kCommand, p.error, kExitUsage);
  if (p.kind != PathKind::kCheckpoint) {
    return fail(kCommand, wrong_kind(p, "a checkpoint directory (ROOT/TAG)"), kExitUsage);
  }
  std::filesystem::path dir = std::filesystem::path(p.path).lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();
  const std::string tag = dir.filename().string();
  const std::string root = dir.has_parent_path() ? dir.parent_path().string() : ".";
  auto options = engine_options_from_env();
  if (!options.is_ok()) return fail(kCommand, options.status().to_string(), kExitUsage);
  CheckpointOptions copts;
  copts.engine = *options;
  auto manager = CheckpointManager::open(root, copts);
  if (!manager.is_ok()) {
    const Status& st = manager.status();
    return fail(kCommand, st.code() == StatusCode::kBusy ? st.message() : st.to_string(),
                kExitFailure);
  }
  auto before = read_manifest(p.path);
  auto copied = (*manager)->materialize(tag);
  Status closed = (*manager)->close();
  if (!copied.is_ok()) return fail(kCommand, copied.status().to_string(), kExitFailure);
  if (!closed.is_ok()) return fail(kCommand, closed.to_string(), kExitFailure);
  if (*copied == 0) {
    std::cout << "checkpoint " << p.path
              << " references no other checkpoint: it is standalone already\n";
    return kExitOk;
  }
  std::string bases;
  if (before.is_ok()) {
    for (const std::string& b : checkpoint::referenced_tags(*before))
      bases += (bases.empty() ? "" : ", ") + b;
  }
  std::cout << "materialized checkpoint " << p.path << ": copied " << *copied << " bytes from "
            << bases << "; it no longer depends on "
            << (bases.find(',') == std::string::npos ? "it" : "them") << "\n";
  return kExitOk;
}

std::vector<std::string> python_args(const Args& a) {
  std::vector<std::string> argv;
  if (a.tag) argv.insert(argv.end(), {"--tag", *a.tag});
  if (a.prefix) argv.insert(argv.end(), {"--prefix", *a.prefix});
  if (a.compression) argv.insert(argv.end(), {"--compression", *a.compression});
  if (a.compression_level)
    argv.insert(argv.end(), {"--compression-level", std::to_string(*a.compression_level)});
  if (a.drop_non_tensors) argv.push_back("--drop-non-tensors");
  if (a.unsafe_pickle) argv.push_back("--unsafe-pickle");
  if (a.overwrite) argv.push_back("--overwrite");
  // Without either flag Python decides, like verify: a bar when stderr (ours, inherited through
  // exec) is a terminal.
  if (a.progress) argv.push_back("--progress");
  if (a.no_progress) argv.push_back("--no-progress");
  argv.insert(argv.end(), {"--", a.src, a.dst});
  return argv;
}

int run(const Args& a) {
  if (a.materialize) return run_materialize(a);
  if (a.dst.empty()) return fail(kCommand, "DST is required (or --materialize CKPT)", kExitUsage);
  return exec_python(kCommand, kBootstrap, python_args(a), "fastpersist and torch");
}

}  // namespace

Command add_convert_command(CLI::App& parent) {
  auto args = std::make_shared<Args>();
  CLI::App* app = parent.add_subcommand(
      "convert",
      "Convert between torch files (.pt/.pth/.bin), .safetensors files and checkpoint "
      "directories; import torch.distributed.checkpoint directories and DeepSpeed ZeRO "
      "folders (runs Python: needs fastpersist and torch there)");
  app->add_option("SRC", args->src,
                  "Torch file, .safetensors file, checkpoint directory, root (its latest), "
                  "torch.distributed.checkpoint directory, or DeepSpeed ZeRO checkpoint folder")
      ->required();
  app->add_option("DST", args->dst,
                  "*.safetensors, *.pt/.pth/.bin/.ckpt (torch format), or anything else: a new "
                  "checkpoint directory ROOT/TAG (required, except with --materialize)");
  app->add_option("--tag", args->tag,
                  "Checkpoint DST: DST is the root and TAG the new checkpoint's tag");
  app->add_option("--prefix", args->prefix,
                  "Only tensors whose name starts with PREFIX (e.g. 'model.'), stripped of it");
  app->add_option("--compression", args->compression,
                  "Checkpoint DST: store tensors compressed with zstd or lz4, or none (raw, plain "
                  "safetensors files; the default): compresses or decompresses a checkpoint")
      ->check(CLI::IsMember({"none", "zstd", "lz4"}));
  app->add_option("--compression-level", args->compression_level,
                  "Checkpoint DST: the codec's level (zstd: 1 by default, up to 22; lz4: 0..12)");
  app->add_flag("--drop-non-tensors", args->drop_non_tensors,
                "Safetensors DST: leave out non-tensor values instead of failing");
  app->add_flag("--unsafe-pickle", args->unsafe_pickle,
                "Load torch files, checkpoint objects and the pickles of DCP and DeepSpeed "
                "checkpoints with weights_only=False (runs arbitrary pickled code: only for "
                "files you trust)");
  app->add_flag("--overwrite", args->overwrite, "Replace an existing DST file");
  app->add_flag("--materialize", args->materialize,
                "SRC is an incremental checkpoint: copy the base files it references into it, "
                "in place (no DST), so that it no longer depends on its base");
  auto* progress_flag =
      app->add_flag("--progress", args->progress,
                    "Show a progress bar on stderr (default: when stderr is a terminal)");
  app->add_flag("--no-progress", args->no_progress, "Never show the progress bar")
      ->excludes(progress_flag);
  app->footer(
      "Python: $FASTPERSIST_PYTHON, else python3 next to this executable, else python3 on PATH.\n"
      "Exit status: 0 done, 1 failed, 2 bad arguments.");
  return {app, [args] { return run(*args); }};
}

}  // namespace fastpersist::cli
