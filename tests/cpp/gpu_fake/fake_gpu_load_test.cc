// SPDX-License-Identifier: Apache-2.0
// CheckpointReader::load into device memory (LoadDestination::memory), against the fake CUDA
// runtime of fake_gpu_library.cc: raw tensors of the destination's dtype are copied to the
// device from the pinned slots of the staged read (never read O_DIRECT into device memory, never
// memcpy'd there), checksums are checked on the slot's bytes, and a device destination that
// needs a conversion is left to the caller (kCallerCopies) with the tensor in new host memory.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_test_util.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_load.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/pinned_buffer.h"
#include "testing/temp_dir.h"

namespace fastpersist::testing {
namespace {

const bool kFakeGpuConfigured = [] {
  ::unsetenv("FASTPERSIST_DISABLE_CUDA");
  ::setenv("FASTPERSIST_CUDA_RUNTIME_LIBRARY", FASTPERSIST_FAKE_GPU_LIBRARY, 1);
  ::setenv("FASTPERSIST_CUFILE_LIBRARY", FASTPERSIST_FAKE_GPU_LIBRARY, 1);
  return true;
}();

struct Fake {
  void* (*malloc)(size_t, int);
  void (*free)(void*);
  int (*device_used)(int);
  uint64_t (*bytes_to_device)();
  Fake() {
    void* lib = ::dlopen(FASTPERSIST_FAKE_GPU_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) std::abort();
    malloc = reinterpret_cast<void* (*)(size_t, int)>(::dlsym(lib, "fake_cuda_malloc"));
    free = reinterpret_cast<void (*)(void*)>(::dlsym(lib, "fake_cuda_free"));
    device_used = reinterpret_cast<int (*)(int)>(::dlsym(lib, "fake_cuda_device_used"));
    bytes_to_device = reinterpret_cast<uint64_t (*)()>(::dlsym(lib, "fake_cuda_bytes_to_device"));
  }
};

LoadDestination device_destination(const Fake& fake, const OwnedTensor& t, const std::string& dtype,
                                   size_t bytes, std::vector<void*>& owned) {
  LoadDestination d;
  d.name = t.name;
  d.data = static_cast<std::byte*>(fake.malloc(bytes, 1));
  owned.push_back(d.data);
  d.capacity_bytes = bytes;
  d.dtype = dtype;
  d.shape = t.shape;
  d.memory = MemoryKind::kCudaDevice;
  d.device = 1;
  return d;
}

TEST(FakeGpuLoad, RawTensorsGoToDeviceMemoryFromThePinnedSlots) {
  ASSERT_TRUE(kFakeGpuConfigured);
  ASSERT_NE(cuda_runtime_info().library.find("fake_gpu"), std::string::npos);
  Fake fake;
  TempDir dir;
  TestState state;
  state.add("a", "F32", {1000, 3}, 1);             // 12000 bytes: not a multiple of 4096
  state.add("b", "BF16", {5, (3u << 20) + 7}, 2);  // several slots' worth
  state.add("c", "F32", {17}, 3);                  // asked for as F16: a conversion
  state.add("d", "U8", {0}, 4);                    // empty
  CheckpointOptions options;
  auto mgr = CheckpointManager::open(dir.path(), options);
  FP_ASSERT_OK(mgr);
  FP_ASSERT_OK((*mgr)->save("t", state.content()));
  auto engine = IoEngine::create({});
  FP_ASSERT_OK(engine);
  auto reader =
      CheckpointReader::open(dir.path() + "/t", std::shared_ptr<IoEngine>(std::move(*engine)));
  FP_ASSERT_OK(reader);

  std::vector<void*> owned;
  LoadRequest req;
  req.destinations.push_back(device_destination(fake, state.tensors[0], "F32", 12000, owned));
  req.destinations.push_back(
      device_destination(fake, state.tensors[1], "BF16", state.tensors[1].bytes.size(), owned));
  req.destinations.push_back(device_destination(fake, state.tensors[2], "F16", 34, owned));
  req.destinations.push_back(device_destination(fake, state.tensors[3], "U8", 0, owned));
  req.max_memory = 8 << 20;  // a small ring: slots reused while copies to the device run
  const uint64_t copied_before = fake.bytes_to_device();
  auto result = (*reader)->load(req);
  FP_ASSERT_OK(result);
  const LoadResult& r = *result;
  ASSERT_EQ(r.destinations.size(), 4u);
  EXPECT_EQ(r.destinations[0], DestinationState::kFilled);
  EXPECT_EQ(r.destinations[1], DestinationState::kFilled);
  EXPECT_EQ(r.destinations[2], DestinationState::kCallerCopies);
  for (int i : {0, 1}) {
    const auto& bytes = state.tensors[static_cast<size_t>(i)].bytes;
    EXPECT_EQ("", first_difference(
                      bytes, std::span<const std::byte>(
                                 req.destinations[static_cast<size_t>(i)].data, bytes.size())))
        << state.tensors[static_cast<size_t>(i)].name;
  }
  // "c" came back in new host memory as F16, for the caller to copy.
  const LoadedTensor& c = r.tensors[static_cast<size_t>(r.loaded_index[2])];
  EXPECT_EQ(c.destination, -1);
  ASSERT_NE(c.buffer, nullptr);
  EXPECT_EQ(c.dtype, "F16");
  // Every byte of "a" and "b" reached the device through copies, none any other way.
  EXPECT_EQ(fake.bytes_to_device() - copied_before,
            state.tensors[0].bytes.size() + state.tensors[1].bytes.size());
  EXPECT_EQ(fake.device_used(0), 0) << "a context on device 0, which no destination lives on";
  for (void* p : owned) fake.free(p);
}

TEST(FakeGpuLoad, ADamagedTensorIsReportedFromTheSlotsBytes) {
  Fake fake;
  TempDir dir;
  TestState state;
  state.add("w", "F32", {3000}, 9);
  auto mgr = CheckpointManager::open(dir.path(), CheckpointOptions{});
  FP_ASSERT_OK(mgr);
  FP_ASSERT_OK((*mgr)->save("t", state.content()));
  auto reader = CheckpointReader::open(dir.path() + "/t", IoEngine::create({}).value());
  FP_ASSERT_OK(reader);
  // Flip one byte of the tensor in its data file.
  const ManifestTensor& t = (*reader)->manifest().tensors[0];
  const std::string file = dir.path() + "/t/" + t.file;
  auto bytes = read_whole_file(file);
  FP_ASSERT_OK(bytes);
  (*bytes)[t.offset + 100] ^= std::byte{1};
  FP_ASSERT_OK(write_whole_file(file, *bytes));
  std::vector<void*> owned;
  LoadRequest req;
  req.destinations.push_back(device_destination(fake, state.tensors[0], "F32", 12000, owned));
  Status st = (*reader)->load(req).status();
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.to_string();
  for (void* p : owned) fake.free(p);
}

}  // namespace
}  // namespace fastpersist::testing
