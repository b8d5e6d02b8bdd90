// SPDX-License-Identifier: Apache-2.0
// XXH3 throughput, side by side in one run: xxHash's default entry points (SSE2 on x86-64, what
// fastpersist called before it used the dispatching ones) against the CPU-dispatched ones
// (XXH3_*_dispatch: AVX2 or AVX-512 when the CPU has them), which src/format/checksum.cc and
// src/stream/parallel_commit.cc use when the library exports them (FASTPERSIST_XXH_DISPATCH).
// Every checksum of a save, a load and a verify, and every incremental save's XXH3-128, runs
// through them. Bytes are hashed from memory (a buffer larger than the caches), 64-bit and
// 128-bit, one-shot and streamed in 1 MiB pieces as the writers' staging does.
//
//   g++ -O2 -std=c++20 bench/checksum_bench.cc -o build/checksum_bench -lxxhash
//   build/checksum_bench [--mib 1024] [--rounds 5]
#define XXH_DISPATCH_DISABLE_REPLACE  // keep the default entry points under their own names
#define XXH_STATIC_LINKING_ONLY       // XXH3_state_t on the stack
#include <xxh_x86dispatch.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double seconds_of(const std::function<void()>& fn) {
  auto t0 = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  size_t mib = 1024;
  int rounds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--mib")
      mib = std::strtoull(argv[i + 1], nullptr, 10);
    else if (k == "--rounds")
      rounds = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--mib N] [--rounds R]\n", argv[0]);
      return 2;
    }
  }
  const size_t bytes = mib << 20;
  std::vector<unsigned char> data(bytes);
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<unsigned char>(i * 2654435761u >> 13);
  volatile uint64_t sink = 0;
  constexpr size_t kPiece = size_t{1} << 20;
  struct Case {
    const char* name;
    std::function<void()> fn;
  };
  auto stream64 = [&](XXH_errorcode (*update)(XXH3_state_t*, const void*, size_t)) {
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    for (size_t at = 0; at < bytes; at += kPiece)
      update(&st, data.data() + at, std::min(kPiece, bytes - at));
    sink = sink + XXH3_64bits_digest(&st);
  };
  std::vector<std::pair<Case, Case>> cases = {
      {{"xxh3-64 one-shot", [&] { sink = sink + XXH3_64bits(data.data(), bytes); }},
       {"", [&] { sink = sink + XXH3_64bits_dispatch(data.data(), bytes); }}},
      {{"xxh3-128 one-shot", [&] { sink = sink + XXH3_128bits(data.data(), bytes).low64; }},
       {"", [&] { sink = sink + XXH3_128bits_dispatch(data.data(), bytes).low64; }}},
      {{"xxh3-64 streamed, 1 MiB pieces", [&] { stream64(XXH3_64bits_update); }},
       {"", [&] { stream64(XXH3_64bits_update_dispatch); }}},
  };
  std::printf("%zu MiB from memory, %d rounds (best), default and dispatched alternating\n", mib,
              rounds);
  std::printf("%-32s %14s %17s %8s\n", "hash", "default GB/s", "dispatched GB/s", "ratio");
  for (auto& [plain, dispatched] : cases) {
    double best_plain = 1e30, best_dispatched = 1e30;
    for (int r = 0; r < rounds; ++r) {
      best_plain = std::min(best_plain, seconds_of(plain.fn));
      best_dispatched = std::min(best_dispatched, seconds_of(dispatched.fn));
    }
    std::printf("%-32s %14.2f %17.2f %7.2fx\n", plain.name, bytes / best_plain / 1e9,
                bytes / best_dispatched / 1e9, best_plain / best_dispatched);
  }
  return sink == 42 ? 1 : 0;
}
