// SPDX-License-Identifier: Apache-2.0
// `fastpersist convert SRC DST`: torch files (.pt/.pth/.bin) <-> .safetensors <-> checkpoint
// directories, and imports of torch.distributed.checkpoint and DeepSpeed ZeRO folders. Reading
// and writing torch pickles needs torch, so this command runs Python:
//
//   <python> -c <bootstrap> [options] -- SRC DST      (the bootstrap runs fastpersist.convert)
//
// which is `python -m fastpersist.convert` with a clear message when fastpersist (or torch) is
// missing from that Python (which Python: python_exec.h). Both sides parse the options with one
// declaration (convert_args.h). The process is replaced (exec), so the exit status, signals and
// terminal are Python's: 0 done, 1 failed, 2 bad arguments. Python draws the progress bar from the
// bytes it reads and writes through `_core.ProgressBar`, verify's bar (src/common/progress.h).

#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint_paths.h"
#include "command.h"
#include "convert_args.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/maintenance.h"
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

// `convert --materialize CKPT`: in place, in C++ (no Python): the incremental checkpoint's
// referenced base files are copied into it and its manifest replaced (incremental/materialize.h),
// through a CheckpointManager of its root, so the root's lock keeps a training job out.
int run_materialize(const ConvertArgs& a) {
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
    for (const std::string& b : referenced_checkpoints(*before))
      bases += (bases.empty() ? "" : ", ") + b;
  }
  std::cout << "materialized checkpoint " << p.path << ": copied " << *copied << " bytes from "
            << bases << "; it no longer depends on "
            << (bases.find(',') == std::string::npos ? "it" : "them") << "\n";
  return kExitOk;
}

int run(const ConvertArgs& a) {
  if (std::string problem = convert_usage_error(a); !problem.empty()) {
    return fail(kCommand, problem, kExitUsage);
  }
  if (a.materialize) return run_materialize(a);
  // Python parses these with the same declaration (convert_args.h). Without --progress or
  // --no-progress it decides, like verify: a bar when stderr (ours, inherited through exec)
  // is a terminal.
  return exec_python(kCommand, kBootstrap, a.to_argv(), "fastpersist and torch");
}

}  // namespace

Command add_convert_command(CLI::App& parent) {
  auto args = std::make_shared<ConvertArgs>();
  CLI::App* app = parent.add_subcommand(
      "convert",
      "Convert between torch files (.pt/.pth/.bin), .safetensors files and checkpoint "
      "directories; import torch.distributed.checkpoint directories and DeepSpeed ZeRO "
      "folders (runs Python: needs fastpersist and torch there)");
  add_convert_options(*app, *args);
  app->footer(
      "Python: $FASTPERSIST_PYTHON, else python3 next to this executable, else python3 on PATH.\n"
      "Exit status: 0 done, 1 failed, 2 bad arguments.");
  return {app, [args] { return run(*args); }};
}

}  // namespace fastpersist::cli
