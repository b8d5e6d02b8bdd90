// SPDX-License-Identifier: Apache-2.0
#include "common/prefault.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <vector>

namespace fastpersist {
namespace {

// The fraction of [p, p + n) resident in memory (mincore).
double resident(const std::byte* p, size_t n) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((n + page - 1) / page);
  if (::mincore(const_cast<std::byte*>(p), n, vec.data()) != 0) return -1;
  size_t in = 0;
  for (unsigned char v : vec) in += v & 1;
  return static_cast<double>(in) / static_cast<double>(vec.size());
}

struct Mapping {
  explicit Mapping(size_t n) : size(n) {
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    data = p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
  }
  ~Mapping() {
    if (data != nullptr) ::munmap(data, size);
  }
  std::byte* data = nullptr;
  size_t size = 0;
};

TEST(PrefaultTest, EveryPageOfEveryRangeIsResidentAndStillZero) {
  // Pieces of 16 MiB: one range of several pieces with a partial last one, and a small one.
  Mapping big((size_t{40} << 20) + 4096 * 3);
  Mapping small(4096 * 5);
  ASSERT_NE(big.data, nullptr);
  ASSERT_NE(small.data, nullptr);
  EXPECT_LT(resident(big.data, big.size), 0.5) << "a new anonymous mapping starts mostly absent";
  prefault_memory({{big.data, big.size}, {small.data, small.size}});
  EXPECT_EQ(resident(big.data, big.size), 1.0);
  EXPECT_EQ(resident(small.data, small.size), 1.0);
  std::vector<std::byte> zeros(small.size);
  EXPECT_EQ(std::memcmp(small.data, zeros.data(), small.size), 0);
  EXPECT_EQ(big.data[big.size - 1], std::byte{0});
  // Writable afterwards, like any other memory.
  std::memset(big.data, 7, big.size);
  EXPECT_EQ(big.data[big.size / 2], std::byte{7});
}

TEST(PrefaultTest, NothingToDoIsFine) {
  prefault_memory({});
  Mapping m(4096);
  prefault_memory({{m.data, 0}});
  SUCCEED();
}

}  // namespace
}  // namespace fastpersist
