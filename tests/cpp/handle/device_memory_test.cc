// SPDX-License-Identifier: Apache-2.0
// Device memory on AioHandle and GdsHandle. Where this process has no CUDA runtime or no cuFile
// (CI, this test's usual home), every call that needs the GPU must fail with kUnavailable naming
// what is missing, before it creates, opens for writing or truncates anything, and the handles
// keep working for host memory. The device address is never dereferenced: if a check were
// missing, the call would crash or leave a file behind. With a GPU these checks skip; the round
// trips on real device memory are tests/python/test_gpu_handles.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "fastpersist/aio_handle.h"
#include "fastpersist/gds_handle.h"
#include "fastpersist/pinned_buffer.h"
#include "handle/device_staging.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"
#include "testing/test_util.h"

namespace fastpersist::testing {
namespace {

MemorySpan fake_device_memory(size_t bytes) {
  return MemorySpan::cuda(reinterpret_cast<void*>(uintptr_t{0x7f0000200000}), bytes, 0);
}

class DeviceMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    old_ = random_bytes(3 * 4096 + 11, 7);
    FP_ASSERT_OK(write_whole_file(dir_.file("old.bin"), old_));
  }
  // The folder holds exactly old.bin, with its old bytes.
  void expect_unchanged() {
    EXPECT_EQ(list_dir(dir_.path()), std::vector<std::string>{"old.bin"});
    auto now = read_whole_file(dir_.file("old.bin"));
    ASSERT_TRUE(now.is_ok());
    EXPECT_EQ("", first_difference(old_, *now));
  }

  TempDir dir_;
  std::vector<std::byte> old_;
};

void expect_unavailable(const Status& st, const std::string& names) {
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.to_string();
  EXPECT_NE(st.message().find(names), std::string::npos) << st.to_string();
}

TEST_F(DeviceMemoryTest, AioHandleWithoutCudaRefusesDeviceMemoryAndChangesNothing) {
  // Without a usable device, whether or not libcudart is installed (CUDA toolkits on GPU-less
  // build machines have it).
  if (cuda_device_copy_ready(0).is_ok()) GTEST_SKIP() << "CUDA device 0 is usable here";
  const std::string missing = cuda_runtime_info().available ? "CUDA device 0" : "CUDA runtime";
  auto h = AioHandle::create({});
  FP_ASSERT_OK(h);
  AioHandle& aio = **h;
  MemorySpan dev = fake_device_memory(5000);
  expect_unavailable(aio.pwrite(dev, dir_.file("new.bin"), false, false).status(), missing);
  expect_unavailable(aio.pwrite(dev, dir_.file("new.bin"), false, true).status(), missing);
  expect_unavailable(aio.pwrite(dev, dir_.file("old.bin"), false, false, 0, true).status(),
                     missing);
  expect_unavailable(aio.pread(dev, dir_.file("old.bin"), false, true, 100).status(), missing);
  expect_unavailable(aio.async_pwrite_fd(dev, 0, 0).status(), missing);
  EXPECT_EQ(aio.wait().value(), 0);
  expect_unchanged();

  // validate needs host memory, whatever the machine.
  Status st = aio.pwrite(dev, dir_.file("new.bin"), true, false).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  expect_unchanged();

  // Host memory still works on the same handle.
  std::vector<std::byte> data = random_bytes(10000, 9);
  FP_ASSERT_OK(aio.pwrite(MemorySpan::host(data.data(), data.size()), dir_.file("host.bin"), false,
                          false, 0, true));
  auto back = read_whole_file(dir_.file("host.bin"));
  FP_ASSERT_OK(back);
  EXPECT_EQ("", first_difference(data, *back));
}

TEST_F(DeviceMemoryTest, GdsHandleWithoutGdsRefusesEveryGpuCallAndChangesNothing) {
  GdsInfo info = gds_info();
  // With both libraries loaded, the device itself must be missing for this test to apply;
  // device_copy_ready says whether it is (without touching the caller's device).
  if (info.status().is_ok() && cuda_device_copy_ready(0).is_ok()) {
    GTEST_SKIP() << "CUDA, a device and cuFile are available here";
  }
  const std::string missing = !info.cuda_available     ? "CUDA runtime"
                              : !info.cufile_available ? "cuFile"
                                                       : "CUDA device";
  auto h = GdsHandle::create({});
  FP_ASSERT_OK(h);
  GdsHandle& gds = **h;
  MemorySpan dev = fake_device_memory(4096 * 3 + 1);
  expect_unavailable(gds.pwrite(dev, dir_.file("new.bin"), false, false, 4095).status(), missing);
  expect_unavailable(gds.pwrite(dev, dir_.file("old.bin"), false, true, 0, true).status(), missing);
  expect_unavailable(gds.pread(dev, dir_.file("old.bin"), false, false).status(), missing);
  expect_unavailable(gds.async_pread_fd(dev, 0, 0).status(), missing);
  expect_unavailable(gds.async_pwrite_fd(dev, 0, 0).status(), missing);
  expect_unavailable(gds.pin_device_buffer(dev), missing);
  expect_unavailable(gds.unpin_device_buffer(dev).status(), missing);
  EXPECT_FALSE(gds.is_device_pinned(dev));
  if (!info.status().is_ok()) {
    EXPECT_EQ(gds.mode().rfind("unavailable: GPUDirect Storage is not available", 0), 0u)
        << gds.mode();
  }
  EXPECT_EQ(gds.wait().value(), 0);
  expect_unchanged();

  // Host memory goes through the engine, as DeepNVMe's gds_handle sends CPU tensors to its
  // CPU path.
  std::vector<std::byte> data = random_bytes(3 * 4096 + 5, 3);
  EXPECT_EQ(
      gds.pwrite(MemorySpan::host(data.data(), data.size()), dir_.file("h.bin"), false, true, 4097)
          .value(),
      0);
  EXPECT_EQ(gds.wait().value(), 1);
  std::vector<std::byte> back(data.size());
  EXPECT_EQ(
      gds.pread(MemorySpan::host(back.data(), back.size()), dir_.file("h.bin"), true, false, 4097)
          .value(),
      1);
  EXPECT_EQ("", first_difference(data, back));
}

TEST(GdsInfo, NamesEveryMissingLibrary) {
  GdsInfo info;
  info.cuda_reason = "libcudart not found";
  info.cufile_reason = "libcufile not found";
  Status st = info.status();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("the CUDA runtime (libcudart: libcudart not found) and cuFile "
                              "(libcufile not found)"),
            std::string::npos)
      << st.message();
  info.cuda_available = info.cufile_available = true;
  FP_EXPECT_OK(info.status());
}

TEST(StagingChunks, CoverTheRangeOnceWithAlignedFileOffsetsAfterTheFirst) {
  const uint64_t chunk = 64 << 10;
  for (uint64_t offset : {uint64_t{0}, uint64_t{1}, uint64_t{4095}, uint64_t{4096}, uint64_t{12345},
                          (uint64_t{1} << 40) + 17}) {
    for (uint64_t length : {uint64_t{0}, uint64_t{1}, uint64_t{4095}, chunk - 1, chunk, chunk + 1,
                            5 * chunk + 4097}) {
      auto chunks = handle::plan_staging_chunks(offset, length, chunk);
      uint64_t pos = 0;
      for (size_t i = 0; i < chunks.size(); ++i) {
        const auto& c = chunks[i];
        EXPECT_EQ(c.file_offset, offset + pos);
        EXPECT_EQ(c.memory_offset, pos);
        EXPECT_GT(c.length, 0u);
        EXPECT_EQ(c.slot_offset, c.file_offset % 4096);
        EXPECT_LE(c.slot_offset + c.length, chunk);
        if (i > 0) {
          EXPECT_EQ(c.file_offset % 4096, 0u) << offset << " " << length << " " << i;
        }
        pos += c.length;
      }
      EXPECT_EQ(pos, length) << offset << " " << length;
      // Every chunk but the last is full, so slots are used well.
      for (size_t i = 0; i + 1 < chunks.size(); ++i) {
        EXPECT_EQ(chunks[i].slot_offset + chunks[i].length, chunk);
      }
    }
  }
}

TEST(StagingChunks, SizeFollowsTheEngine) {
  EngineOptions o;
  o.block_size = 1 << 20;
  o.intra_op_parallelism = 8;
  EXPECT_EQ(handle::staging_chunk_bytes(o), size_t{8} << 20);
  o.intra_op_parallelism = 1;
  EXPECT_EQ(handle::staging_chunk_bytes(o), size_t{4} << 20);  // at least 4 MiB
  o.block_size = 32 << 20;
  o.intra_op_parallelism = 8;
  EXPECT_EQ(handle::staging_chunk_bytes(o), size_t{64} << 20);  // at most 64 MiB
}

}  // namespace
}  // namespace fastpersist::testing
