// SPDX-License-Identifier: Apache-2.0
// Format 2 file references: a checkpoint whose manifest names files of another committed
// checkpoint of the root ("<tag>/<file>", what an incremental checkpoint writes) is listed,
// read and verified through them. A reference that is missing, or that a symbolic link or a
// ".." would lead out of the root, makes the checkpoint damaged, never a crash or an escape.
// Also: a tensor in an encoding this build does not know is refused for reading, by name.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/checkpoint_test_util.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/manifest.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace fastpersist::testing {
namespace {

class ReferencesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_ = mixed_state(77);
    engine_ = make_engine();
    ASSERT_NE(engine_, nullptr);
    FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(root_.path(), small_options()));
    FP_ASSERT_OK(mgr->save("base", state_.content()));
    FP_ASSERT_OK(mgr->save("incr", state_.content()));
    FP_ASSERT_OK(mgr->close());
    // "incr" keeps its own objects.pkl and refers to every data file of "base" instead of
    // holding copies, as an incremental checkpoint of an unchanged model does.
    FP_ASSERT_OK_AND_ASSIGN(Manifest base, read_manifest(root_.file("base")));
    FP_ASSERT_OK_AND_ASSIGN(Manifest incr, read_manifest(incr_dir()));
    Manifest refers = base;
    refers.tag = "incr";
    refers.sequence = incr.sequence;
    for (ManifestFile& f : refers.files) {
      if (f.role != "tensors") continue;
      ASSERT_EQ(::unlink((incr_dir() + "/" + f.name).c_str()), 0) << f.name;
      data_files_.push_back(f.name);
      f.name = "base/" + f.name;
    }
    for (ManifestTensor& t : refers.tensors) t.file = "base/" + t.file;
    ASSERT_FALSE(data_files_.empty());
    write_manifest(refers);
  }

  std::string incr_dir() const { return root_.file("incr"); }
  void write_manifest(const Manifest& m) {
    write_text(incr_dir() + "/manifest.json", encode_manifest(m));
  }

  // "incr" is reported damaged by listing, verify and the reader, with `why` in each message.
  void expect_damaged(const std::string& why) {
    std::vector<std::string> skipped;
    FP_ASSERT_OK_AND_ASSIGN(auto listed, list_checkpoints(root_.path(), &skipped));
    for (const CheckpointInfo& c : listed) EXPECT_NE(c.tag, "incr");
    EXPECT_TRUE(any_contains(skipped, "incr: ")) << joined(skipped);
    EXPECT_TRUE(any_contains(skipped, why)) << joined(skipped);
    FP_ASSERT_OK_AND_ASSIGN(VerifyReport report, verify_checkpoint(incr_dir(), *engine_));
    EXPECT_FALSE(report.ok());
    EXPECT_TRUE(any_contains(report.problems, why)) << joined(report.problems);
    auto reader = CheckpointReader::open(incr_dir(), engine_);
    ASSERT_FALSE(reader.is_ok());
    EXPECT_EQ(reader.status().code(), StatusCode::kDataLoss) << reader.status().to_string();
    EXPECT_NE(reader.status().message().find(why), std::string::npos)
        << reader.status().to_string();
  }

  TempDir root_;
  TempDir outside_;
  TestState state_;
  std::shared_ptr<IoEngine> engine_;
  std::vector<std::string> data_files_;
};

TEST_F(ReferencesTest, ReferencedFilesAreListedReadAndVerified) {
  EXPECT_EQ(listed_tags(root_.path()), (std::vector<std::string>{"base", "incr"}));
  expect_checkpoint_matches(incr_dir(), state_);
  FP_ASSERT_OK_AND_ASSIGN(VerifyReport report, verify_checkpoint(incr_dir(), *engine_));
  EXPECT_TRUE(report.ok()) << joined(report.problems);
  EXPECT_GE(report.bytes_checked, state_.total_bytes());
}

TEST_F(ReferencesTest, DamageInTheReferencedFileIsFoundByVerify) {
  FP_ASSERT_OK_AND_ASSIGN(Manifest m, read_manifest(incr_dir()));
  const ManifestTensor& t = m.tensors[0];
  flip_byte(root_.file(t.file), t.offset);
  FP_ASSERT_OK_AND_ASSIGN(VerifyReport report, verify_checkpoint(incr_dir(), *engine_));
  EXPECT_TRUE(any_contains(report.problems, "tensor '" + t.name + "'")) << joined(report.problems);
}

TEST_F(ReferencesTest, RemovedReferencedCheckpointMakesItDamaged) {
  FP_ASSERT_OK(checkpoint::remove_tree(root_.file("base")));
  expect_damaged("refers to checkpoint 'base', which is not in the root");
}

TEST_F(ReferencesTest, MissingReferencedFileMakesItDamaged) {
  ASSERT_EQ(::unlink(root_.file("base/" + data_files_[0]).c_str()), 0);
  expect_damaged("base/" + data_files_[0]);
  std::vector<std::string> skipped;
  FP_ASSERT_OK_AND_ASSIGN(auto listed, list_checkpoints(root_.path(), &skipped));
  EXPECT_TRUE(any_contains(skipped, "is missing")) << joined(skipped);
}

TEST_F(ReferencesTest, ReferencedCheckpointWithoutManifestIsNotFollowed) {
  ASSERT_EQ(::unlink(root_.file("base/manifest.json").c_str()), 0);
  expect_damaged("which is not a committed checkpoint");
}

TEST_F(ReferencesTest, SymlinkedReferencedCheckpointIsNotFollowedOutOfTheRoot) {
  // The same bytes, outside the root, behind a link under the tag's name.
  const std::string moved = outside_.file("base");
  ASSERT_EQ(::rename(root_.file("base").c_str(), moved.c_str()), 0);
  ASSERT_EQ(::symlink(moved.c_str(), root_.file("base").c_str()), 0);
  expect_damaged("is a symbolic link");
}

TEST_F(ReferencesTest, SymlinkedReferencedFileIsNotFollowedOutOfTheRoot) {
  const std::string file = root_.file("base/" + data_files_[0]);
  const std::string moved = outside_.file(data_files_[0]);
  ASSERT_EQ(::rename(file.c_str(), moved.c_str()), 0);
  ASSERT_EQ(::symlink(moved.c_str(), file.c_str()), 0);
  expect_damaged("whose file is a symbolic link");
}

TEST_F(ReferencesTest, DotDotAndAbsoluteNamesAreDamagedManifests) {
  // A file outside the root that a ".." or an absolute name would reach.
  write_text(outside_.file("stolen.safetensors"), std::string(8192, 'x'));
  const std::string outside_rel =
      "../" + outside_.path().substr(outside_.path().rfind('/') + 1) + "/stolen.safetensors";
  for (const std::string& name : {outside_rel, std::string("base/../../stolen.safetensors"),
                                  outside_.file("stolen.safetensors"), std::string("../base/x")}) {
    SCOPED_TRACE(name);
    FP_ASSERT_OK_AND_ASSIGN(Manifest m, read_manifest(root_.file("base")));
    m.tag = "incr";
    for (ManifestTensor& t : m.tensors) {
      if (t.file == m.files[0].name) t.file = name;
    }
    m.files[0].name = name;
    write_manifest(m);
    expect_damaged("manifest field 'files[0].name'");
  }
}

TEST_F(ReferencesTest, UnknownEncodingIsRefusedForReadingByName) {
  FP_ASSERT_OK_AND_ASSIGN(Manifest m, read_manifest(incr_dir()));
  size_t k = 0;
  while (m.tensors[k].length == 0) ++k;
  m.tensors[k].encoding = "delta-xor";
  write_manifest(m);
  // The cheap checks pass: the manifest is well formed, only this build cannot decode it.
  EXPECT_EQ(listed_tags(root_.path()), (std::vector<std::string>{"base", "incr"}));
  FP_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::open(incr_dir(), engine_));
  const std::string why =
      "tensor '" + m.tensors[k].name + "': encoding \"delta-xor\" is not supported";
  auto refused = reader->read({{k, nullptr}}, /*verify=*/true);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable) << refused.status().to_string();
  EXPECT_NE(refused.status().message().find(why), std::string::npos)
      << refused.status().to_string();
  Status pieces = reader->read_pieces(
      k, 4096, true, [](uint64_t, const std::byte*, size_t) { return Status::ok(); });
  EXPECT_EQ(pieces.code(), StatusCode::kUnavailable) << pieces.to_string();
  // Every other tensor still reads.
  FP_ASSERT_OK(reader->read({{k == 0 ? size_t{1} : size_t{0}, nullptr}}, true).status());
  FP_ASSERT_OK_AND_ASSIGN(VerifyReport report, verify_checkpoint(incr_dir(), *engine_));
  EXPECT_EQ(report.problems.size(), 1u) << joined(report.problems);
  EXPECT_TRUE(any_contains(report.problems, why)) << joined(report.problems);
}

}  // namespace
}  // namespace fastpersist::testing
