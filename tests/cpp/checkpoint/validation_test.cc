// SPDX-License-Identifier: Apache-2.0
// What save_async refuses on the caller's thread, before anything is queued or written: bad tags,
// bad tensor descriptions, bad aliases, metadata that is not a JSON object; and bad options
// refused by open.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "checkpoint/checkpoint_test_util.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/pinned_buffer.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace fastpersist::testing {
namespace {

TEST(ValidateTagTest, AcceptsPortableNames) {
  for (const std::string& tag : std::vector<std::string>{
           "a", "step-100", "epoch_3.step-7", "A.B-c_d", "latest2", "x.", std::string(200, 't')}) {
    FP_EXPECT_OK(validate_tag(tag));
  }
}

TEST(ValidateTagTest, RefusesEverythingElse) {
  for (const std::string& tag :
       {std::string(), std::string(".hidden"), std::string(".tmp-x"), std::string("latest"),
        std::string("a/b"), std::string(".."), std::string("."), std::string("with space"),
        std::string("tab\t"), std::string("über"), std::string(201, 't'), std::string("a\0b", 3)}) {
    Status st = validate_tag(tag);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << "'" << tag << "': " << st.to_string();
    EXPECT_FALSE(st.message().empty());
  }
}

class ContentValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = CheckpointManager::open(dir_.path(), small_options());
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    mgr_ = std::move(m).value();
    state_.add("w", "F32", {4, 4}, 1);
    state_.add("b", "F16", {4}, 2);
  }
  void TearDown() override {
    if (mgr_) {
      // Nothing was queued, so there is nothing to report, and nothing was written.
      FP_EXPECT_OK(mgr_->close());
      EXPECT_TRUE(listed_tags(dir_.path()).empty());
      EXPECT_TRUE(names_with_prefix(dir_.path(), ".tmp-").empty());
    }
  }
  void expect_refused(const CheckpointContent& c, const std::string& needle) {
    auto r = mgr_->save_async("t", c);
    ASSERT_FALSE(r.is_ok()) << "accepted content that should be refused (" << needle << ")";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().to_string();
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().to_string();
  }
  TempDir dir_;
  TestState state_;
  std::unique_ptr<CheckpointManager> mgr_;
};

TEST_F(ContentValidationTest, BadTagsAreRefused) {
  for (const char* tag : {"", ".x", "latest", "a/b", "../escape"}) {
    auto r = mgr_->save_async(tag, state_.content());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << "'" << tag << "'";
  }
}

TEST_F(ContentValidationTest, NbytesMustMatchShapeAndDtype) {
  CheckpointContent c = state_.content();
  c.tensors[0].nbytes -= 1;
  expect_refused(c, "'w'");
  c = state_.content();
  c.tensors[1].shape = {5};
  expect_refused(c, "'b'");
}

TEST_F(ContentValidationTest, UnknownDtype) {
  CheckpointContent c = state_.content();
  c.tensors[0].dtype = "F33";
  expect_refused(c, "F33");
  c.tensors[0].dtype = "";
  expect_refused(c, "dtype");
}

TEST_F(ContentValidationTest, DuplicateAndReservedNames) {
  CheckpointContent c = state_.content();
  c.tensors[1] = c.tensors[0];
  expect_refused(c, "'w'");
  c = state_.content();
  c.tensors[0].name = "__metadata__";
  expect_refused(c, "__");
  c = state_.content();
  c.tensors[0].name = "";
  expect_refused(c, "name");
}

TEST_F(ContentValidationTest, MissingData) {
  CheckpointContent c = state_.content();
  c.tensors[0].data = nullptr;
  expect_refused(c, "'w'");
}

TEST_F(ContentValidationTest, InvalidDevice) {
  CheckpointContent c = state_.content();
  c.tensors[1].device = -2;
  expect_refused(c, "'b'");
}

// A tensor in GPU memory needs a working CUDA runtime. Without one the save is refused at once;
// with a runtime but no usable device (this CI image: libcudart, no driver) the snapshot fails
// with CUDA's own reason. Either way the error names the tensor and nothing is committed or left
// behind. (With a GPU the snapshot copies device memory; tests/python/test_gpu_snapshot.py.)
TEST_F(ContentValidationTest, DeviceMemoryNeedsAWorkingCudaRuntime) {
  if (cuda_device_copy_ready(0).is_ok()) GTEST_SKIP() << "CUDA device 0 is usable here";
  CheckpointContent c = state_.content();
  c.tensors[0].device = 0;
  auto r = mgr_->save_async("t", c);
  Status st = r.is_ok() ? r->wait() : r.status();
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("'w'"), std::string::npos) << st.to_string();
  if (!cuda_runtime_info().available) {
    EXPECT_FALSE(r.is_ok()) << "refused before anything is queued";
    EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.to_string();
    EXPECT_NE(st.message().find("CUDA runtime is not available"), std::string::npos)
        << st.to_string();
  } else {
    EXPECT_NE(st.message().find("CUDA device 0"), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find("cudaError"), std::string::npos) << st.to_string();
  }
}

TEST_F(ContentValidationTest, Aliases) {
  CheckpointContent c = state_.content();
  c.aliases = {{"tied", "missing"}};
  expect_refused(c, "missing");
  c.aliases = {{"w", "b"}};  // an alias may not shadow a stored tensor
  expect_refused(c, "'w'");
}

TEST_F(ContentValidationTest, MetadataMustBeAJsonObject) {
  for (const char* bad : {"", "[1,2]", "\"text\"", "{not json", "42", "{\"a\":1} trailing"}) {
    CheckpointContent c = state_.content();
    c.metadata_json = bad;
    expect_refused(c, "metadata");
  }
}

TEST(OpenOptionsTest, BadOptionsAreRefused) {
  TempDir dir;
  CheckpointOptions o = small_options();
  o.staging_window_bytes = 1000;
  EXPECT_EQ(CheckpointManager::open(dir.path(), o).status().code(), StatusCode::kInvalidArgument);
  o = small_options();
  o.staging_window_bytes = 0;
  EXPECT_EQ(CheckpointManager::open(dir.path(), o).status().code(), StatusCode::kInvalidArgument);
  o = small_options();
  o.max_in_flight = 0;
  EXPECT_EQ(CheckpointManager::open(dir.path(), o).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckpointManager::open("", small_options()).status().code(),
            StatusCode::kInvalidArgument);
  // A root that is a file.
  write_text(dir.file("file"), "x");
  EXPECT_FALSE(CheckpointManager::open(dir.file("file"), small_options()).is_ok());
  // A root below a file cannot be created (missing parent directories are created, as
  // `mkdir -p` and torch.distributed.checkpoint's FileSystemWriter do).
  EXPECT_FALSE(CheckpointManager::open(dir.file("file/below"), small_options()).is_ok());
}

// The one check of the manager's settings, which the Python package runs too: each setting out
// of range is named, before anything is created on disk.
TEST(OpenOptionsTest, ValidateNamesTheSettingOutOfRange) {
  EXPECT_TRUE(small_options().validate().is_ok());
  auto refused = [](void (*spoil)(CheckpointOptions&), const std::string& named) {
    CheckpointOptions o = small_options();
    spoil(o);
    Status st = o.validate();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << named;
    EXPECT_NE(st.message().find(named), std::string::npos) << st.message();
    TempDir dir;
    EXPECT_EQ(CheckpointManager::open(dir.file("root"), o).status().code(),
              StatusCode::kInvalidArgument);
    EXPECT_FALSE(std::filesystem::exists(dir.file("root"))) << named;
  };
  refused([](CheckpointOptions& o) { o.max_in_flight = 0; }, "max_in_flight must be >= 1");
  refused([](CheckpointOptions& o) { o.keep_last = 0; }, "keep_last must be >= 1");
  refused([](CheckpointOptions& o) { o.keep_every = 0; }, "keep_every must be >= 1");
  refused([](CheckpointOptions& o) { o.keep_every = -3; }, "keep_every must be >= 1");
  refused([](CheckpointOptions& o) { o.full_every = 0; }, "full_every must be >= 1");
  refused([](CheckpointOptions& o) { o.xor_deltas = true; }, "xor_deltas needs incremental");
  refused([](CheckpointOptions& o) { o.staging_window_bytes = 0; }, "staging");
  CheckpointOptions kept = small_options();
  kept.keep_last = 1;
  kept.keep_every = 1;
  kept.incremental = true;
  kept.xor_deltas = true;
  EXPECT_TRUE(kept.validate().is_ok());
}

}  // namespace
}  // namespace fastpersist::testing
