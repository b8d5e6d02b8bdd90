// SPDX-License-Identifier: Apache-2.0
#include "python_exec.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "checkpoint_paths.h"
#include "command.h"

namespace fastpersist::cli {
namespace {

// execv / execvp; returns only on failure (errno set).
void exec_one(const std::string& python, const std::vector<std::string>& args, bool search_path) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(python.c_str()));
  for (const std::string& s : args) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  if (search_path) {
    ::execvp(python.c_str(), argv.data());
  } else {
    ::execv(python.c_str(), argv.data());
  }
}

bool is_executable_file(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec) && ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

int exec_python(const std::string& command, const std::string& bootstrap,
                const std::vector<std::string>& rest, const std::string& needs) {
  std::vector<std::string> args = {"-c", bootstrap};
  args.insert(args.end(), rest.begin(), rest.end());
  const char* env = std::getenv("FASTPERSIST_PYTHON");
  if (env != nullptr && env[0] != '\0') {
    std::string python = env;
    exec_one(python, args, python.find('/') == std::string::npos);
    return fail(command, "cannot run FASTPERSIST_PYTHON=" + python + ": " + std::strerror(errno),
                kExitFailure);
  }
  std::vector<std::string> tried;
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (const char* name : {"python3", "python"}) {
      std::string candidate = (self.parent_path() / name).string();
      tried.push_back(candidate);
      if (!is_executable_file(candidate)) continue;
      exec_one(candidate, args, false);
      return fail(command, "cannot run " + candidate + ": " + std::strerror(errno), kExitFailure);
    }
  }
  for (const char* name : {"python3", "python"}) {
    tried.push_back(std::string(name) + " on PATH");
    exec_one(name, args, true);
    if (errno != ENOENT) {
      return fail(command, std::string("cannot run ") + name + ": " + std::strerror(errno),
                  kExitFailure);
    }
  }
  std::string list;
  for (const std::string& t : tried) list += (list.empty() ? "" : ", ") + t;
  return fail(command,
              "no Python found (tried " + list + "); " + command + " needs a Python with " + needs +
                  " installed: set FASTPERSIST_PYTHON to it",
              kExitFailure);
}

}  // namespace fastpersist::cli
