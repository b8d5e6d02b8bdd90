// SPDX-License-Identifier: Apache-2.0
// How main.cc finds the subcommands: each *_command.cc registers one CLI11 subcommand on the
// top-level app and returns the function that runs it once the command line parsed.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace fastpersist::cli {

// Exit codes shared by every subcommand, so scripts can tell a bad call from a failed run.
constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;  // the work itself failed (I/O error, out of memory, ...), or
                                 // `verify` found damage
constexpr int kExitUsage = 2;    // bad arguments; nothing was done

struct Command {
  CLI::App* app = nullptr;  // owned by the parent app
  std::function<int()> run;
};

Command add_report_command(CLI::App& parent);
Command add_io_bench_command(CLI::App& parent);
// Checkpoints (docs/cli.md): list, inspect, verify, prune; convert runs Python.
Command add_list_command(CLI::App& parent);
Command add_inspect_command(CLI::App& parent);
Command add_verify_command(CLI::App& parent);
Command add_prune_command(CLI::App& parent);
Command add_convert_command(CLI::App& parent);
// Tiers: copy a root's checkpoints into another root.
Command add_drain_command(CLI::App& parent);
// When to save: the Young/Daly interval.
Command add_advise_command(CLI::App& parent);
// Maintenance: temporaries of dead writers.
Command add_clean_command(CLI::App& parent);
// `fastpersist tune`: tune_command.cc.
Command add_tune_command(CLI::App& parent);

}  // namespace fastpersist::cli
