// SPDX-License-Identifier: Apache-2.0
// Faulting new memory in before anything reads into it: on a VM whose host backs guest memory
// lazily, a page first touched inside an O_DIRECT read's submission (or a buffered read's copy)
// costs far more than one touched by a CPU write, and one core faults slower than all of them
// (docs/performance.md, "The pooled ring, and new memory filled through it").
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace fastpersist {

// Faults every page of each [data, data + size) range in, writable (MADV_POPULATE_WRITE, or
// writing zeros where the kernel lacks it: the ranges must be new, zero-filled memory), in
// 16 MiB pieces spread over every core. Advice only: a piece that cannot be faulted in now is
// faulted in by whatever writes it later.
void prefault_memory(const std::vector<std::pair<std::byte*, size_t>>& ranges);

}  // namespace fastpersist
