// SPDX-License-Identifier: Apache-2.0
// The parallel writers' record file (<partial>.done), as another writer or a crash may leave it:
// read_records on any bytes gives records or none, never a crash; what it gives is written and
// read back unchanged.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "fuzz_target.h"
#include "stream/parallel_records.h"

namespace {

std::string temp_path() {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir && *dir ? dir : "/tmp") + "/fastpersist-fuzz-records-" +
           std::to_string(::getpid());
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = temp_path();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  if (size > 0) std::fwrite(data, 1, size, f);
  std::fclose(f);
  auto records = fastpersist::stream::read_records(path);
  if (!records.empty()) {
    FUZZ_CHECK(fastpersist::stream::write_records(path, records).is_ok());
    auto again = fastpersist::stream::read_records(path);
    FUZZ_CHECK(again.size() == records.size());
    for (size_t i = 0; i < records.size(); ++i) {
      FUZZ_CHECK(again[i].rank == records[i].rank && again[i].same_attempt(records[i]));
    }
  }
  std::remove(path.c_str());
  return 0;
}
