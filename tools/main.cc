// SPDX-License-Identifier: Apache-2.0
// `fastpersist`: diagnostics and benchmarks for the fastpersist I/O engine.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <filesystem>
#include <exception>
#include <iostream>
#include <new>
#include <vector>

#include "command.h"
#include "fastpersist/config_file.h"

int main(int argc, char** argv) {
  using namespace fastpersist::cli;
  CLI::App app{"fastpersist: save and load deep-learning checkpoints at the speed of the storage",
               "fastpersist"};
  app.set_version_flag("--version", FASTPERSIST_VERSION);
  app.require_subcommand(1);
  std::vector<Command> commands = {add_report_command(app), add_io_bench_command(app),
                                   add_list_command(app),   add_inspect_command(app),
                                   add_verify_command(app), add_prune_command(app),
                                   add_convert_command(app), add_clean_command(app),
                                   add_drain_command(app), add_advise_command(app),
                                   add_tune_command(app)};
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
      return c.run();
    } catch (const std::bad_alloc&) {
      std::cerr << "fastpersist: out of memory\n";
    } catch (const std::exception& e) {
      std::cerr << "fastpersist: " << e.what() << "\n";
    }
    return kExitFailure;
  }
  return kExitUsage;
}
