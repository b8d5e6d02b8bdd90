// SPDX-License-Identifier: Apache-2.0
// `fastpersist`: diagnostics and benchmarks for the fastpersist I/O engine.
#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>
#include <new>
#include <vector>

#include "command.h"

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
                                   add_drain_command(app), add_advise_command(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version end here too, with code 0.
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
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
