// SPDX-License-Identifier: Apache-2.0
// The one path classifier (CLI and Python both ask it): every kind, and the case the CLI and
// convert.py once disagreed on, a directory with data files but no manifest.json.
#include "checkpoint/path_kind.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "checkpoint/checkpoint_test_util.h"
#include "fastpersist/checkpoint.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace fastpersist::testing {
namespace {

class PathKindTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TestState s;
    s.add("w", "F32", {8}, 1);
    FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir_.path(), small_options()));
    FP_ASSERT_OK(mgr->save("committed", s.content()));
    FP_ASSERT_OK(mgr->save("incomplete", s.content()));
    ASSERT_EQ(::unlink(dir_.file("incomplete/manifest.json").c_str()), 0);
  }

  PathKind kind(const std::string& name) { return classify_path(dir_.file(name)).kind; }

  TempDir dir_;
};

TEST_F(PathKindTest, CheckpointsRootsAndIncompleteDirectories) {
  EXPECT_EQ(classify_path(dir_.path()).kind, PathKind::kRoot);
  EXPECT_EQ(kind("committed"), PathKind::kCheckpoint);
  EXPECT_EQ(kind("incomplete"), PathKind::kIncompleteCheckpoint);
  // Only objects.pkl left, or only a data file: still not a root.
  ASSERT_EQ(::mkdir(dir_.file("sidecar_only").c_str(), 0755), 0);
  write_text(dir_.file("sidecar_only/objects.pkl"), "x");
  EXPECT_EQ(kind("sidecar_only"), PathKind::kIncompleteCheckpoint);
  ASSERT_EQ(::mkdir(dir_.file("foreign").c_str(), 0755), 0);
  write_text(dir_.file("foreign/tensors-00000-of-00001.safetensors"), "x");
  EXPECT_EQ(kind("foreign"), PathKind::kIncompleteCheckpoint);
  // A folder of other things is a root (maybe of nothing).
  ASSERT_EQ(::mkdir(dir_.file("logs").c_str(), 0755), 0);
  write_text(dir_.file("logs/tensors.txt"), "x");
  EXPECT_EQ(kind("logs"), PathKind::kRoot);

  PathInfo manifest = classify_path(dir_.file("committed/manifest.json"));
  EXPECT_EQ(manifest.kind, PathKind::kCheckpoint);
  EXPECT_EQ(manifest.path, dir_.file("committed"));
}

TEST_F(PathKindTest, FilesBySuffixAndByContent) {
  write_text(dir_.file("a.safetensors"), "anything");  // the name decides
  EXPECT_EQ(kind("a.safetensors"), PathKind::kSafetensors);
  for (const char* name : {"m.pt", "m.pth", "m.bin", "m.ckpt"}) {
    write_text(dir_.file(name), "anything");
    EXPECT_EQ(kind(name), PathKind::kTorchFile) << name;
  }
  write_text(dir_.file("zip.data"), std::string("PK\x03\x04", 4) + "rest");
  EXPECT_EQ(kind("zip.data"), PathKind::kTorchFile);
  write_text(dir_.file("legacy.data"), std::string("\x80\x02\x8a\x0a", 4) + "rest");
  EXPECT_EQ(kind("legacy.data"), PathKind::kTorchFile);
  write_text(dir_.file("notes.txt"), "hello");
  EXPECT_EQ(kind("notes.txt"), PathKind::kOtherFile);
  write_text(dir_.file("short"), "PK");  // shorter than any magic number
  EXPECT_EQ(kind("short"), PathKind::kOtherFile);
  ASSERT_EQ(::mkfifo(dir_.file("fifo").c_str(), 0644), 0);  // never opened
  EXPECT_EQ(kind("fifo"), PathKind::kOtherFile);
}

TEST_F(PathKindTest, MissingSaysWhy) {
  PathInfo missing = classify_path(dir_.file("nope"));
  EXPECT_EQ(missing.kind, PathKind::kMissing);
  EXPECT_EQ(missing.error, dir_.file("nope") + " does not exist");
  write_text(dir_.file("file"), "x");
  PathInfo below_a_file = classify_path(dir_.file("file/child"));
  EXPECT_EQ(below_a_file.kind, PathKind::kMissing);
  EXPECT_NE(below_a_file.error.find("cannot examine"), std::string::npos) << below_a_file.error;
}

TEST(PathKindNames, EveryKindHasANameAndADescription) {
  EXPECT_EQ(path_kind_name(PathKind::kIncompleteCheckpoint), "incomplete_checkpoint");
  EXPECT_EQ(describe_path_kind(PathKind::kIncompleteCheckpoint)
                .rfind("an incomplete or foreign checkpoint directory", 0),
            0u);
  for (PathKind k :
       {PathKind::kMissing, PathKind::kCheckpoint, PathKind::kIncompleteCheckpoint, PathKind::kRoot,
        PathKind::kSafetensors, PathKind::kTorchFile, PathKind::kOtherFile}) {
    EXPECT_FALSE(path_kind_name(k).empty());
    EXPECT_FALSE(describe_path_kind(k).empty());
  }
}

}  // namespace
}  // namespace fastpersist::testing
