// SPDX-License-Identifier: Apache-2.0
// TempDir: a fresh directory under $TMPDIR (or /tmp) that is removed, with everything in it,
// when the object goes out of scope. Each test gets its own, so tests can run in parallel.
#pragma once

#include <string>
#include <string_view>

namespace fastpersist::testing {

class TempDir {
 public:
  // Creates <$TMPDIR or /tmp>/fastpersist-test-XXXXXX; aborts the test process if it cannot,
  // because no test can say anything useful without a place to put files.
  TempDir();
  // Same, inside `parent` (e.g. a mount point).
  explicit TempDir(const std::string& parent);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path() + "/" + name; creates nothing.
  std::string file(std::string_view name) const;

 private:
  std::string path_;
};

// The folder temporary files go to: $TMPDIR when set and non-empty, else /tmp.
std::string temp_root();

// Removes `path` and everything below it, without following symlinks or crossing into other
// mounts; restores permissions (chmod 000 folders) on the way. Errors are ignored.
void remove_tree(const std::string& path);

}  // namespace fastpersist::testing
