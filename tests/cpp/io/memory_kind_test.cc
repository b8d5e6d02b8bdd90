// SPDX-License-Identifier: Apache-2.0
// A request carries the kind of memory it targets, and the engine, which moves host memory
// only (bounce memcpy, pread/pwrite, the kernel), refuses device memory before it touches
// anything: no file created, none truncated, no worker ever sees the address, and the engine
// keeps working. The address used here is never dereferenced, which is the point: if the check
// were missing, the write below would read it (and crash) or create the file.
#include "fastpersist/memory_kind.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fastpersist/io_engine.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"
#include "testing/test_util.h"

namespace fastpersist::testing {
namespace {

// An address no host code may read: the engine must refuse it without dereferencing it.
std::byte* fake_device_address() { return reinterpret_cast<std::byte*>(uintptr_t{0x7f0000001000}); }

IoRequest device_request(IoKind kind, const std::string& path, uint64_t length, uint64_t offset) {
  IoRequest r;
  r.kind = kind;
  r.path = path;
  r.buffer = fake_device_address();
  r.length = length;
  r.file_offset = offset;
  r.memory = MemoryKind::kCudaDevice;
  r.device = 0;
  return r;
}

class MemoryKindTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (auto why = backend_skip_reason(GetParam())) GTEST_SKIP() << *why;
    EngineOptions o;
    o.backend = GetParam();
    o.intra_op_parallelism = 2;
    auto e = IoEngine::create(o);
    ASSERT_TRUE(e.is_ok()) << e.status().to_string();
    engine_ = std::move(e).value();
  }

  TempDir dir_;
  std::unique_ptr<IoEngine> engine_;
};

TEST_P(MemoryKindTest, DeviceWriteIsRefusedAndCreatesNoFile) {
  const std::string path = dir_.file("new.bin");
  for (auto call : {0, 1, 2}) {  // submit, start, run: every entry point checks
    IoRequest r = device_request(IoKind::kWrite, path, (8u << 20) + 5, 4097);
    Status st = call == 0   ? engine_->submit(r).status()
                : call == 1 ? engine_->start(r).status()
                            : engine_->run(r).status();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("CUDA device 0"), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find("host memory only"), std::string::npos) << st.to_string();
    EXPECT_EQ(st.path(), path);
  }
  EXPECT_TRUE(list_dir(dir_.path()).empty());
  EXPECT_EQ(engine_->pending(), 0u);
  EXPECT_EQ(engine_->stats().requests, 0u);
}

TEST_P(MemoryKindTest, DeviceTruncatingWriteLeavesTheFileAsItWas) {
  const std::string path = dir_.file("old.bin");
  std::vector<std::byte> old = random_bytes(10000, 1);
  FP_ASSERT_OK(write_whole_file(path, old));
  IoRequest r = device_request(IoKind::kWrite, path, 100, 0);
  r.truncate = true;
  EXPECT_EQ(engine_->submit(r).status().code(), StatusCode::kInvalidArgument);
  FP_ASSERT_OK_AND_ASSIGN(auto now, read_whole_file(path));
  EXPECT_EQ("", first_difference(old, now));
}

TEST_P(MemoryKindTest, DeviceReadIsRefusedAndTheEngineKeepsWorking) {
  const std::string path = dir_.file("data.bin");
  std::vector<std::byte> data = random_bytes(3 * 4096 + 17, 2);
  FP_ASSERT_OK(write_whole_file(path, data));
  Status st = engine_->run(device_request(IoKind::kRead, path, data.size(), 0)).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();

  // The same read into host memory (the default kind) works afterwards.
  TestBuffer back(data.size());
  IoRequest r;
  r.kind = IoKind::kRead;
  r.path = path;
  r.buffer = back.data();
  r.length = data.size();
  FP_ASSERT_OK(engine_->run(r));
  EXPECT_EQ("", first_difference(data, back.span()));
}

TEST_P(MemoryKindTest, DeviceRequestOnACallersDescriptorIsRefused) {
  const std::string path = dir_.file("fd.bin");
  std::vector<std::byte> old = random_bytes(4096, 3);
  FP_ASSERT_OK(write_whole_file(path, old));
  IoRequest r = device_request(IoKind::kWrite, "", 4096, 0);
  r.fd = 0;  // never opened or reopened: the check comes first
  Status st = engine_->run(r).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_EQ(st.path(), "fd 0");
  FP_ASSERT_OK_AND_ASSIGN(auto now, read_whole_file(path));
  EXPECT_EQ("", first_difference(old, now));
}

TEST(MemoryKindNames, AreStable) {
  EXPECT_STREQ(memory_kind_name(MemoryKind::kHost), "host");
  EXPECT_STREQ(memory_kind_name(MemoryKind::kCudaDevice), "cuda");
  EXPECT_EQ(static_cast<int>(MemoryKind::kHost), 0);
  EXPECT_EQ(static_cast<int>(MemoryKind::kCudaDevice), 1);
  MemorySpan d = MemorySpan::cuda(fake_device_address(), 10, 3);
  EXPECT_TRUE(d.on_device());
  EXPECT_EQ(d.device, 3);
  EXPECT_FALSE(MemorySpan::host(nullptr, 0).on_device());
}

INSTANTIATE_TEST_SUITE_P(AllBackends, MemoryKindTest, ::testing::ValuesIn(real_backends()),
                         [](const auto& p) { return std::string(backend_name(p.param)); });

}  // namespace
}  // namespace fastpersist::testing
