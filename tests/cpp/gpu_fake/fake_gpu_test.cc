// SPDX-License-Identifier: Apache-2.0
// The GPU code paths of AioHandle (staging through pinned slots) and GdsHandle (cuFile) run
// here against fake_gpu_library.cc, a fake CUDA runtime + cuFile loaded through
// FASTPERSIST_CUDA_RUNTIME_LIBRARY / FASTPERSIST_CUFILE_LIBRARY. "Device memory" is host
// memory the fake hands out and polices: a copy in the wrong direction, a slot written before
// its copy was waited for, a cuFile call without a selected device or with the wrong base of a
// registered buffer, a short cuFile transfer not resumed, or a context on a device nobody used
// fails these tests. What a fake cannot show (DMA speed, real stream ordering, the driver)
// is left to tests/python/test_gpu_handles.py on a GPU.
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "fastpersist/aio_handle.h"
#include "fastpersist/gds_handle.h"
#include "fastpersist/pinned_buffer.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"
#include "testing/test_util.h"

namespace fastpersist::testing {
namespace {

// Before main: fastpersist reads these at its first use of CUDA or cuFile.
const bool kFakeGpuConfigured = [] {
  ::unsetenv("FASTPERSIST_DISABLE_CUDA");
  ::unsetenv("CUFILE_FORCE_COMPAT_MODE");
  ::setenv("FASTPERSIST_CUDA_RUNTIME_LIBRARY", FASTPERSIST_FAKE_GPU_LIBRARY, 1);
  ::setenv("FASTPERSIST_CUFILE_LIBRARY", FASTPERSIST_FAKE_GPU_LIBRARY, 1);
  return true;
}();

struct FakeGpu {
  void* (*malloc)(size_t, int);
  void (*free)(void*);
  int (*device_used)(int);
  int (*live_handles)();
  FakeGpu() {
    void* lib = ::dlopen(FASTPERSIST_FAKE_GPU_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) std::abort();
    malloc = reinterpret_cast<void* (*)(size_t, int)>(::dlsym(lib, "fake_cuda_malloc"));
    free = reinterpret_cast<void (*)(void*)>(::dlsym(lib, "fake_cuda_free"));
    device_used = reinterpret_cast<int (*)(int)>(::dlsym(lib, "fake_cuda_device_used"));
    live_handles = reinterpret_cast<int (*)()>(::dlsym(lib, "fake_cufile_live_handles"));
  }
};

FakeGpu& fake() {
  static FakeGpu f;
  return f;
}

// `bytes` of fake memory of `device`, filled from `seed` (or with `fill` when seed is 0).
class DeviceBuffer {
 public:
  DeviceBuffer(size_t bytes, int device, uint64_t seed, unsigned char fill = 0)
      : data_(static_cast<std::byte*>(fake().malloc(bytes, device))),
        bytes_(bytes),
        device_(device) {
    if (data_ == nullptr || bytes > (size_t{1} << 40)) std::abort();  // also bounds GCC's analysis
    if (seed != 0) {
      fill_random({data_, bytes}, seed);
    } else {
      for (size_t i = 0; i < bytes; ++i) data_[i] = std::byte{fill};
    }
  }
  ~DeviceBuffer() { fake().free(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  MemorySpan span(size_t offset = 0) const {
    return MemorySpan::cuda(data_ + offset, bytes_ - offset, device_);
  }
  std::span<const std::byte> bytes() const { return {data_, bytes_}; }
  std::byte* data() const { return data_; }

 private:
  std::byte* data_;
  size_t bytes_;
  int device_;
};

struct Case {
  size_t bytes;
  uint64_t offset;
};
// Sizes and offsets that are not multiples of 4096, within one chunk and across several.
const std::vector<Case> kCases = {{1, 0},          {4095, 1},
                                  {4096, 4097},    {(9u << 20) + 17, 12345},
                                  {(5u << 20), 0}, {(4u << 20) - 3, (4u << 20) - 5}};

class FakeGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(kFakeGpuConfigured);
    ASSERT_TRUE(cuda_runtime_info().available) << cuda_runtime_info().reason;
    ASSERT_NE(cuda_runtime_info().library.find("fake_gpu"), std::string::npos);
  }
  // The file holds `expected` at `offset` (and whatever lies before it).
  void expect_file(const std::string& path, uint64_t offset, std::span<const std::byte> expected) {
    auto got = read_whole_file(path);
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    ASSERT_EQ(got->size(), offset + expected.size());
    EXPECT_EQ("", first_difference(expected, std::span<const std::byte>(*got).subspan(offset)));
  }
  TempDir dir_;
};

TEST_F(FakeGpuTest, AioHandleStagesDeviceMemoryBothWays) {
  EngineOptions o;
  o.block_size = 1 << 20;
  o.intra_op_parallelism = 3;
  auto h = AioHandle::create(o);
  FP_ASSERT_OK(h);
  for (const Case& c : kCases) {
    DeviceBuffer src(c.bytes, 1, c.bytes + 1);
    const std::string path = dir_.file("aio-" + std::to_string(c.bytes));
    ASSERT_EQ((*h)->pwrite(src.span(), path, false, false, c.offset, true).value(), 1);
    expect_file(path, c.offset, src.bytes());
    DeviceBuffer back(c.bytes, 1, 0);
    ASSERT_EQ((*h)->pread(back.span(), path, false, true, c.offset).value(), 0);  // async
    ASSERT_EQ((*h)->wait().value(), 1);
    EXPECT_EQ("", first_difference(src.bytes(), back.bytes())) << c.bytes << " at " << c.offset;
  }
  EXPECT_EQ(fake().device_used(0), 0) << "a context on device 0, which no buffer lives on";
}

TEST_F(FakeGpuTest, AioHandleDeviceRequestsOnACallersDescriptorAndMixedWithHostOnes) {
  auto h = AioHandle::create({});
  FP_ASSERT_OK(h);
  const std::string path = dir_.file("fd.bin");
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  ASSERT_TRUE(fd.valid());
  DeviceBuffer a((6u << 20) + 5, 1, 7);
  // The two writes must not overlap: concurrent async writes to one range have no order.
  std::vector<std::byte> host = random_bytes(4096, 8);
  ASSERT_EQ((*h)->async_pwrite_fd(a.span(), fd.get(), 4096).value(), 0);
  ASSERT_EQ((*h)->async_pwrite_fd(MemorySpan::host(host.data(), host.size()), fd.get(), 0).value(),
            0);
  EXPECT_EQ((*h)->wait().value(), 2);  // each caller request counts once, however many chunks
  expect_file(path, 4096, a.bytes());
  auto got = read_whole_file(path);
  ASSERT_TRUE(got.is_ok());
  EXPECT_EQ("", first_difference(std::span<const std::byte>(host).first(4096),
                                 std::span<const std::byte>(*got).first(4096)));
}

TEST_F(FakeGpuTest, EmptyDeviceBuffersCreateAndTruncateLikeHostOnes) {
  auto aio = AioHandle::create({});
  auto gds = GdsHandle::create({});
  FP_ASSERT_OK(aio);
  FP_ASSERT_OK(gds);
  DeviceBuffer empty(0, 1, 0);
  for (int which = 0; which < 2; ++which) {
    const std::string path = dir_.file(which == 0 ? "aio-empty" : "gds-empty");
    FP_ASSERT_OK(write_whole_file(path, random_bytes(5000, 1)));
    Result<int> n = which == 0 ? (*aio)->pwrite(empty.span(), path, false, false, 0, true)
                               : (*gds)->pwrite(empty.span(), path, false, false, 0, true);
    ASSERT_EQ(n.value(), 1);
    auto size = file_size(path);
    ASSERT_TRUE(size.is_ok());
    EXPECT_EQ(*size, 0u) << path;
    const std::string fresh = path + "-new";
    n = which == 0 ? (*aio)->pwrite(empty.span(), fresh, false, false)
                   : (*gds)->pwrite(empty.span(), fresh, false, false);
    ASSERT_EQ(n.value(), 1);
    EXPECT_TRUE(file_size(fresh).is_ok()) << fresh << " was not created";
  }
}

TEST_F(FakeGpuTest, AioHandleReadPastTheEndLeavesDeviceMemoryAlone) {
  auto h = AioHandle::create({});
  FP_ASSERT_OK(h);
  const std::string path = dir_.file("short.bin");
  FP_ASSERT_OK(write_whole_file(path, random_bytes(5000, 3)));
  DeviceBuffer dst(8192, 1, 0, 0x33);
  Status st = (*h)->pread(dst.span(), path, false, false).status();
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.to_string();
  for (std::byte b : dst.bytes()) ASSERT_EQ(b, std::byte{0x33});
  EXPECT_EQ((*h)->pread(dst.span(), path, true, false).status().code(),
            StatusCode::kInvalidArgument);  // validate needs host memory
}

TEST_F(FakeGpuTest, GdsHandleRoundTripsThroughCuFile) {
  ASSERT_TRUE(gds_info().status().is_ok()) << gds_info().status().to_string();
  EngineOptions o;
  o.intra_op_parallelism = 3;
  auto h = GdsHandle::create(o);
  FP_ASSERT_OK(h);
  for (const Case& c : kCases) {
    DeviceBuffer src(c.bytes, 1, c.bytes + 2);
    const std::string path = dir_.file("gds-" + std::to_string(c.bytes));
    ASSERT_EQ((*h)->pwrite(src.span(), path, false, true, c.offset, true).value(), 0);
    ASSERT_EQ((*h)->wait().value(), 1);
    expect_file(path, c.offset, src.bytes());
    DeviceBuffer back(c.bytes, 1, 0);
    ASSERT_EQ((*h)->pread(back.span(), path, false, false, c.offset).value(), 1);
    EXPECT_EQ("", first_difference(src.bytes(), back.bytes())) << c.bytes << " at " << c.offset;
  }
  EXPECT_EQ(fake().live_handles(), 0) << "a cuFile file handle was not deregistered";
  EXPECT_EQ(fake().device_used(0), 0) << "a context on device 0, which no buffer lives on";
  EXPECT_NE((*h)->mode().find("nvidia-fs not in use"), std::string::npos) << (*h)->mode();
}

TEST_F(FakeGpuTest, GdsHandlePinnedBuffersAndViewsInsideThem) {
  auto h = GdsHandle::create({});
  FP_ASSERT_OK(h);
  DeviceBuffer pinned((3u << 20) + 100, 1, 11);
  FP_ASSERT_OK((*h)->pin_device_buffer(pinned.span()));
  EXPECT_TRUE((*h)->is_device_pinned(pinned.span(777)));
  EXPECT_EQ((*h)->pin_device_buffer(pinned.span(10)).code(), StatusCode::kInvalidArgument);
  // A view that starts inside the registered buffer: cuFile must get the buffer's base.
  const std::string path = dir_.file("view.bin");
  ASSERT_EQ((*h)->pwrite(pinned.span(777), path, false, false, 3, true).value(), 1);
  expect_file(path, 3, pinned.bytes().subspan(777));
  DeviceBuffer back((3u << 20) + 100, 1, 0);
  FP_ASSERT_OK((*h)->pin_device_buffer(back.span()));
  ASSERT_EQ((*h)->pread(back.span(777), path, false, false, 3).value(), 1);
  EXPECT_EQ("", first_difference(pinned.bytes().subspan(777), back.bytes().subspan(777)));
  EXPECT_TRUE((*h)->unpin_device_buffer(pinned.span()).value());
  EXPECT_FALSE((*h)->unpin_device_buffer(pinned.span()).value());
  EXPECT_FALSE((*h)->is_device_pinned(pinned.span()));
  // `back` stays pinned: the handle unpins it when it goes.
}

TEST_F(FakeGpuTest, GdsHandleRefusesAnUnknownDeviceBeforeOpeningAnything) {
  auto h = GdsHandle::create({});
  FP_ASSERT_OK(h);
  DeviceBuffer src(100, 1, 5);
  MemorySpan wrong = src.span();
  wrong.device = 7;  // the fake has devices 0 and 1
  Status st = (*h)->pwrite(wrong, dir_.file("never.bin"), false, false).status();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.to_string();
  EXPECT_NE(st.message().find("CUDA device 7"), std::string::npos) << st.to_string();
  EXPECT_TRUE(list_dir(dir_.path()).empty());
}

}  // namespace
}  // namespace fastpersist::testing
