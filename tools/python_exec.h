// SPDX-License-Identifier: Apache-2.0
// Handing a command over to Python (what `convert` and `tune --plot` do): the process is replaced
// (exec), so the exit status, signals and terminal are Python's.
//
// The Python is $FASTPERSIST_PYTHON when set; else the python3 (or python) next to this
// executable, which is the environment's bin/ when pip installed it; else python3 (or python)
// on PATH.
#pragma once

#include <string>
#include <vector>

namespace fastpersist::cli {

// Runs `<python> -c <bootstrap> args...`. Returns only when no Python could be started: the
// exit status after printing why (`command` names the subcommand, `needs` what the Python must
// have, e.g. "fastpersist and torch").
int exec_python(const std::string& command, const std::string& bootstrap,
                const std::vector<std::string>& args, const std::string& needs);

}  // namespace fastpersist::cli
