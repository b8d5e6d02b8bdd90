// SPDX-License-Identifier: Apache-2.0
#include "run_cli.h"

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include "command.h"
#include "fastpersist/config_file.h"
#include "fastpersist/object_store.h"
#include "python_exec.h"

namespace fastpersist::cli {
namespace {

// Set by the Python package's entry point, so that a Python without a client fails instead of
// handing the command back and forth.
constexpr const char* kInPythonVariable = "FASTPERSIST_CLI_IN_PYTHON";

// -1 when this process can run the command line itself; else the exit status of handing it to
// the Python package (which only returns when no Python could be started).
int hand_object_stores_to_python(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  bool names_store = false;
  for (const std::string& a : args) names_store = names_store || is_object_store_url(a);
  if (!names_store || object_store_opener_installed()) return -1;
  if (const char* in = std::getenv(kInPythonVariable); in != nullptr && in[0] == '1') return -1;
  return exec_python("object stores",
                     "import sys\nfrom fastpersist.cli import main\nsys.exit(main(sys.argv[1:]))",
                     args, "the fastpersist package and boto3 (pip install fastpersist[s3])");
}

}  // namespace

int run_cli(int argc, char** argv) {
  if (int handed = hand_object_stores_to_python(argc, argv); handed >= 0) return handed;
  CLI::App app{"fastpersist: save and load deep-learning checkpoints at the speed of the storage",
               "fastpersist"};
  app.set_version_flag("--version", FASTPERSIST_VERSION);
  app.require_subcommand(1);
  std::vector<Command> commands = {
      add_report_command(app),  add_io_bench_command(app), add_list_command(app),
      add_inspect_command(app), add_verify_command(app),   add_prune_command(app),
      add_convert_command(app), add_clean_command(app),    add_drain_command(app),
      add_advise_command(app),  add_tune_command(app)};
  // Every command's engine settings start from this configuration file (config_file.h). It is
  // passed on as FASTPERSIST_CONFIG, so the commands and the processes they start read it alike.
  std::string config;
  app.add_option("--config", config,
                 "A configuration file (what `fastpersist tune --output` writes) for every I/O "
                 "setting not given otherwise; also FASTPERSIST_CONFIG");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version end here too, with code 0.
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  }
  if (!config.empty()) {
    fastpersist::Result<fastpersist::ConfigFile> checked = fastpersist::read_config_file(config);
    if (!checked.is_ok()) {
      std::cerr << "fastpersist: error: --config: " << checked.status().message() << "\n";
      return kExitUsage;
    }
    std::error_code ec;
    const std::string absolute = std::filesystem::absolute(config, ec).string();
    ::setenv(fastpersist::kConfigEnvVariable, ec ? config.c_str() : absolute.c_str(), 1);
  }
  for (const Command& c : commands) {
    if (!c.app->parsed()) continue;
    // Every failure a command expects becomes a message and an exit code inside it; this is
    // the last line of defence, so that nothing unexpected ends in a stack trace or abort().
    try {
      int code = c.run();
      std::cout.flush();
      std::cerr.flush();
      return code;
    } catch (const std::bad_alloc&) {
      std::cerr << "fastpersist: out of memory\n";
    } catch (const std::exception& e) {
      std::cerr << "fastpersist: " << e.what() << "\n";
    }
    return kExitFailure;
  }
  return kExitUsage;
}

}  // namespace fastpersist::cli
