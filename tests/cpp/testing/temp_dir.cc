// SPDX-License-Identifier: Apache-2.0
#include "testing/temp_dir.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace fastpersist::testing {
namespace {

std::string make_temp_dir(const std::string& parent) {
  std::string pattern = parent + "/fastpersist-test-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    std::fprintf(stderr, "TempDir: mkdtemp(%s) failed: %s\n", pattern.c_str(),
                 std::strerror(errno));
    std::abort();
  }
  return pattern;
}

void remove_tree_at(const std::string& path, dev_t root_dev) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;
  if (!S_ISDIR(st.st_mode)) {
    ::unlink(path.c_str());
    return;
  }
  if (st.st_dev != root_dev) return;  // a mount a test failed to take down: leave it alone
  // Tests make folders unreadable (chmod 000) to check permission errors; undo that first.
  ::chmod(path.c_str(), 0700);
  std::vector<std::string> children;
  if (DIR* dir = ::opendir(path.c_str())) {
    while (dirent* e = ::readdir(dir)) {
      std::string name = e->d_name;
      if (name != "." && name != "..") children.push_back(path + "/" + name);
    }
    ::closedir(dir);
  }
  for (const std::string& child : children) remove_tree_at(child, root_dev);
  ::rmdir(path.c_str());
}

}  // namespace

std::string temp_root() {
  const char* env = std::getenv("TMPDIR");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string("/tmp");
}

TempDir::TempDir() : path_(make_temp_dir(temp_root())) {}

TempDir::TempDir(const std::string& parent) : path_(make_temp_dir(parent)) {}

TempDir::~TempDir() { remove_tree(path_); }

std::string TempDir::file(std::string_view name) const { return path_ + "/" + std::string(name); }

void remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;
  remove_tree_at(path, st.st_dev);
}

}  // namespace fastpersist::testing
