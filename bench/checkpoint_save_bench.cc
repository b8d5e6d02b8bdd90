// SPDX-License-Identifier: Apache-2.0
// Durable CheckpointManager::save of a synthetic state, timed in C++ (no Python, no torch): the
// number to compare when the save path changes (e.g. builds of two commits, run alternately on
// the same folder). Only the public API of <fastpersist/checkpoint.h> is used, so the same file
// builds against any version of the library.
//
// Build against a build folder's static libraries (from the repository root):
//
//   g++ -O2 -std=c++20 -Iinclude bench/checkpoint_save_bench.cc -o build/checkpoint_save_bench \
//     build/src/libfastpersist_{checkpoint,format,stream,handle,io,buffer,common}.a \
//     -luring -laio -lxxhash -ldl -pthread
//
// Run:  build/checkpoint_save_bench --folder bench-data --gib 2.5 --rounds 3
//
// Prints one line per save and a summary table (median and best seconds, GB/s), plus the
// command line that reproduces it.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "fastpersist/checkpoint.h"

namespace {

struct Args {
  std::string folder = "bench-data";
  double gib = 2.5;
  size_t tensor_mib = 64;
  unsigned rounds = 3;
  size_t budget_mib = 512;
};

bool parse(int argc, char** argv, Args* a) {
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--folder")
      a->folder = v;
    else if (k == "--gib")
      a->gib = std::atof(v);
    else if (k == "--tensor-mib")
      a->tensor_mib = std::strtoull(v, nullptr, 10);
    else if (k == "--rounds")
      a->rounds = static_cast<unsigned>(std::strtoul(v, nullptr, 10));
    else if (k == "--budget-mib")
      a->budget_mib = std::strtoull(v, nullptr, 10);
    else
      return false;
  }
  return argc % 2 == 1 && a->gib > 0 && a->tensor_mib > 0 && a->rounds > 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!parse(argc, argv, &a)) {
    std::fprintf(stderr,
                 "usage: %s [--folder DIR] [--gib 2.5] [--tensor-mib 64] [--rounds 3] "
                 "[--budget-mib 512]\n",
                 argv[0]);
    return 2;
  }
  const size_t tensor_bytes = a.tensor_mib << 20;
  const size_t total = static_cast<size_t>(a.gib * double(1ull << 30));
  // Mostly large F32 tensors plus a tail of small ones of mixed dtypes, like a model's state.
  std::vector<std::vector<float>> storage;
  std::vector<fastpersist::TensorSource> tensors;
  size_t bytes = 0;
  for (size_t i = 0; bytes < total; ++i) {
    size_t n = std::min(tensor_bytes, total - bytes) / sizeof(float);
    if (i % 16 == 15) n = 4097;
    if (n == 0) break;
    storage.emplace_back(n);
    for (size_t k = 0; k < n; k += 1024) storage.back()[k] = float(i * 7 + k);
    fastpersist::TensorSource t;
    t.name = "layer" + std::to_string(i) + ".weight";
    t.dtype = "F32";
    t.shape = {n};
    t.data = reinterpret_cast<const std::byte*>(storage.back().data());
    t.nbytes = n * sizeof(float);
    tensors.push_back(t);
    bytes += t.nbytes;
  }

  std::filesystem::path root = std::filesystem::path(a.folder) / "checkpoint_save_bench";
  std::filesystem::remove_all(root);
  fastpersist::CheckpointOptions options;
  options.staging_budget_bytes = a.budget_mib << 20;
  options.keep_last = 1;  // the folder holds one state's worth at a time
  auto mgr = fastpersist::CheckpointManager::open(root.string(), options);
  if (!mgr.is_ok()) {
    std::fprintf(stderr, "open: %s\n", mgr.status().to_string().c_str());
    return 1;
  }
  std::vector<double> seconds;
  for (unsigned r = 0; r < a.rounds; ++r) {
    fastpersist::CheckpointContent content;
    content.tensors = tensors;
    auto t0 = std::chrono::steady_clock::now();
    fastpersist::Status st = (*mgr)->save("r" + std::to_string(r), std::move(content));
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!st.is_ok()) {
      std::fprintf(stderr, "save: %s\n", st.to_string().c_str());
      return 1;
    }
    seconds.push_back(s);
    std::printf("save %u: %.3f s  %.2f GB/s\n", r, s, double(bytes) / s / 1e9);
  }
  fastpersist::Status closed = (*mgr)->close();
  std::filesystem::remove_all(root);
  if (!closed.is_ok()) {
    std::fprintf(stderr, "close: %s\n", closed.to_string().c_str());
    return 1;
  }
  std::vector<double> sorted = seconds;
  std::sort(sorted.begin(), sorted.end());
  double median = sorted[sorted.size() / 2];
  std::printf("\n| tensors | bytes | budget | saves | median s | best s | median GB/s |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  std::printf("| %zu | %.2f GB | %zu MiB | %u | %.3f | %.3f | %.2f |\n", tensors.size(),
              double(bytes) / 1e9, a.budget_mib, a.rounds, median, sorted.front(),
              double(bytes) / median / 1e9);
  std::printf("\ncommand:");
  for (int i = 0; i < argc; ++i) std::printf(" %s", argv[i]);
  std::printf("\n");
  return 0;
}
