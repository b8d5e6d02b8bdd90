// SPDX-License-Identifier: Apache-2.0
// Alignment arithmetic for O_DIRECT offsets, lengths and addresses. Alignments are powers of two.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fastpersist {

constexpr bool is_power_of_two(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }
constexpr uint64_t align_down(uint64_t x, uint64_t a) { return x & ~(a - 1); }
constexpr uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) & ~(a - 1); }
constexpr bool is_aligned(uint64_t x, uint64_t a) { return (x & (a - 1)) == 0; }
inline bool is_aligned(const void* p, uint64_t a) {
  return is_aligned(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)), a);
}

}  // namespace fastpersist
