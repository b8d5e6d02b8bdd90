// SPDX-License-Identifier: Apache-2.0
#include "common/prefault.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "common/task_pool.h"

namespace fastpersist {

void prefault_memory(const std::vector<std::pair<std::byte*, size_t>>& ranges) {
  constexpr size_t kPieceBytes = size_t{16} << 20;
  size_t pieces = 0;
  for (const auto& [data, size] : ranges) pieces += (size + kPieceBytes - 1) / kPieceBytes;
  if (pieces == 0) return;
  TaskPool pool(TaskPool::choose_threads(0, pieces));
  TaskGroup group(pool);
  for (const auto& [data, size] : ranges) {
    for (size_t at = 0; at < size; at += kPieceBytes) {
      std::byte* p = data + at;
      size_t n = std::min(kPieceBytes, size - at);
      group.run([p, n] {
        if (::madvise(p, n, MADV_POPULATE_WRITE) != 0) std::memset(p, 0, n);  // kernels before 5.14
      });
    }
  }
  group.wait();
}

}  // namespace fastpersist
