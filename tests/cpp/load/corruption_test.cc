// SPDX-License-Identifier: Apache-2.0
// Damaged checkpoints: a flipped data byte, a truncated or missing file, a missing or garbage
// manifest, a damaged safetensors header, a damaged objects sidecar. Each is reported where it
// matters (verify names the tensor or file, the reader refuses with kDataLoss, listing skips
// the directory with a reason) and never silently read as good data.
#include <gtest/gtest.h>
#include <unistd.h>

#include "checkpoint/checkpoint_test_util.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/manifest.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace fastpersist::testing {
namespace {

class CorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_ = mixed_state(51);
    engine_ = make_engine();
    ASSERT_NE(engine_, nullptr);
    FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(dir_.path(), small_options()));
    FP_ASSERT_OK(mgr->save("good", state_.content()));
    FP_ASSERT_OK(mgr->save("victim", state_.content()));
    FP_ASSERT_OK(mgr->close());
    victim_ = dir_.file("victim");
    FP_ASSERT_OK_AND_ASSIGN(manifest_, read_manifest(victim_));
  }

  const ManifestTensor& tensor(const std::string& name) {
    auto k = manifest_.find_tensor(name);
    EXPECT_TRUE(k.has_value()) << name;
    return manifest_.tensors[k.value_or(0)];
  }

  VerifyReport verify() {
    auto r = verify_checkpoint(victim_, *engine_);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? *r : VerifyReport{};
  }

  std::vector<TensorReadRequest> all_requests() const {
    std::vector<TensorReadRequest> out;
    for (size_t i = 0; i < manifest_.tensors.size(); ++i) out.push_back({i, nullptr});
    return out;
  }

  void expect_good_untouched() {
    auto r = verify_checkpoint(dir_.file("good"), *engine_);
    ASSERT_TRUE(r.is_ok());
    EXPECT_TRUE(r->ok()) << joined(r->problems);
  }

  TempDir dir_;
  TestState state_;
  std::shared_ptr<IoEngine> engine_;
  std::string victim_;
  Manifest manifest_;
};

TEST_F(CorruptionTest, FlippedDataByteIsNamedByVerifyAndTheReader) {
  const ManifestTensor& t = tensor("model.layer0.weight");
  flip_byte(victim_ + "/" + t.file, t.offset + t.length / 2);

  VerifyReport report = verify();
  EXPECT_FALSE(report.ok());
  EXPECT_EQ(report.problems.size(), 1u) << joined(report.problems);
  EXPECT_TRUE(any_contains(report.problems, "'model.layer0.weight'")) << joined(report.problems);
  EXPECT_TRUE(any_contains(report.problems, t.file)) << joined(report.problems);

  // Still listed (cheap checks pass), but reading with verification refuses it.
  EXPECT_EQ(listed_tags(dir_.path()), (std::vector<std::string>{"good", "victim"}));
  FP_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::open(victim_, engine_));
  auto bad = reader->read(all_requests(), /*verify=*/true);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss) << bad.status().to_string();
  EXPECT_NE(bad.status().message().find("'model.layer0.weight'"), std::string::npos)
      << bad.status().to_string();
  EXPECT_EQ(bad.status().path(), victim_ + "/" + t.file);

  // Into the caller's memory, too.
  auto k = *manifest_.find_tensor("model.layer0.weight");
  TestBuffer dest(t.length);
  auto bad_direct = reader->read({{k, dest.data(), t.length}}, /*verify=*/true);
  EXPECT_EQ(bad_direct.status().code(), StatusCode::kDataLoss) << bad_direct.status().to_string();
  EXPECT_NE(bad_direct.status().message().find("'model.layer0.weight'"), std::string::npos);

  // Without verification the bytes are read as they are: exactly one differs.
  FP_ASSERT_OK_AND_ASSIGN(auto raw, reader->read(all_requests(), /*verify=*/false));
  const OwnedTensor* want = state_.find("model.layer0.weight");
  std::span<const std::byte> got(raw.data[k], t.length);
  size_t differing = 0;
  for (size_t i = 0; i < t.length; ++i) differing += got[i] != want->bytes[i] ? 1 : 0;
  EXPECT_EQ(differing, 1u);
  // Other tensors of the same checkpoint still verify when read alone.
  auto other = *manifest_.find_tensor("model.embed.weight");
  FP_EXPECT_OK(reader->read({{other, nullptr}}, true));
  expect_good_untouched();
}

TEST_F(CorruptionTest, TruncatedDataFile) {
  const ManifestTensor& t = tensor("optimizer.step_counts");
  std::string path = victim_ + "/" + t.file;
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(t.offset + 1)), 0);

  auto reader = CheckpointReader::open(victim_, engine_);
  EXPECT_EQ(reader.status().code(), StatusCode::kDataLoss) << reader.status().to_string();
  EXPECT_NE(reader.status().message().find(t.file), std::string::npos);

  std::vector<std::string> skipped;
  FP_ASSERT_OK_AND_ASSIGN(auto listed, list_checkpoints(dir_.path(), &skipped));
  EXPECT_EQ(tags_of(listed), (std::vector<std::string>{"good"}));
  ASSERT_EQ(skipped.size(), 1u) << joined(skipped);
  EXPECT_EQ(skipped[0].rfind("victim: ", 0), 0u) << skipped[0];
  EXPECT_NE(skipped[0].find(t.file), std::string::npos) << skipped[0];

  FP_ASSERT_OK_AND_ASSIGN(auto latest, latest_checkpoint(dir_.path()));
  EXPECT_EQ(latest, std::optional<std::string>("good")) << "latest names a damaged checkpoint";

  VerifyReport report = verify();
  EXPECT_TRUE(any_contains(report.problems, t.file)) << joined(report.problems);
  expect_good_untouched();
}

TEST_F(CorruptionTest, MissingDataFile) {
  ASSERT_EQ(::unlink((victim_ + "/" + manifest_.tensors[0].file).c_str()), 0);
  EXPECT_EQ(CheckpointReader::open(victim_, engine_).status().code(), StatusCode::kDataLoss);
  std::vector<std::string> skipped;
  FP_ASSERT_OK_AND_ASSIGN(auto listed, list_checkpoints(dir_.path(), &skipped));
  EXPECT_EQ(tags_of(listed), (std::vector<std::string>{"good"}));
  EXPECT_EQ(skipped.size(), 1u);
  EXPECT_TRUE(any_contains(verify().problems, "missing"));
}

TEST_F(CorruptionTest, MissingManifestIsNotACheckpoint) {
  ASSERT_EQ(::unlink((victim_ + "/manifest.json").c_str()), 0);
  std::vector<std::string> skipped;
  FP_ASSERT_OK_AND_ASSIGN(auto listed, list_checkpoints(dir_.path(), &skipped));
  EXPECT_EQ(tags_of(listed), (std::vector<std::string>{"good"}));
  EXPECT_TRUE(skipped.empty()) << joined(skipped);
  EXPECT_EQ(CheckpointReader::open(victim_, engine_).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(any_contains(verify().problems, "manifest.json is missing"));
  FP_ASSERT_OK_AND_ASSIGN(auto latest, latest_checkpoint(dir_.path()));
  EXPECT_EQ(latest, std::optional<std::string>("good"));
  // A directory that does not exist at all cannot be examined.
  EXPECT_FALSE(verify_checkpoint(dir_.file("nonexistent"), *engine_).is_ok());
}

TEST_F(CorruptionTest, GarbageManifestIsSkippedWithAReason) {
  write_text(victim_ + "/manifest.json", "{\"format\": \"fastpersist-checkpoint\", garbage");
  std::vector<std::string> skipped;
  FP_ASSERT_OK_AND_ASSIGN(auto listed, list_checkpoints(dir_.path(), &skipped));
  EXPECT_EQ(tags_of(listed), (std::vector<std::string>{"good"}));
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].rfind("victim: ", 0), 0u) << skipped[0];
  EXPECT_NE(skipped[0].find("manifest"), std::string::npos) << skipped[0];
  EXPECT_EQ(CheckpointReader::open(victim_, engine_).status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(any_contains(verify().problems, "manifest.json is damaged"))
      << joined(verify().problems);

  // An empty manifest (a crash of a filesystem that lies about flushes) too.
  write_text(victim_ + "/manifest.json", "");
  skipped.clear();
  FP_ASSERT_OK_AND_ASSIGN(listed, list_checkpoints(dir_.path(), &skipped));
  EXPECT_EQ(tags_of(listed), (std::vector<std::string>{"good"}));
  EXPECT_EQ(skipped.size(), 1u);
}

TEST_F(CorruptionTest, DamagedSafetensorsHeaderIsReportedByVerify) {
  const ManifestFile& f = manifest_.files[0];
  ASSERT_EQ(f.role, "tensors");
  std::string path = victim_ + "/" + f.name;
  // Inside the JSON (the first byte is '{'): the header no longer parses and fails its checksum.
  flip_byte(path, 8);
  VerifyReport report = verify();
  EXPECT_FALSE(report.ok());
  EXPECT_TRUE(any_contains(report.problems, "header")) << joined(report.problems);
  EXPECT_TRUE(any_contains(report.problems, f.name)) << joined(report.problems);
  // A verified load refuses to trust the damaged header's offsets; an unverified one is not
  // asked to check.
  {
    FP_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::open(victim_, engine_));
    std::vector<TensorReadRequest> in_file;
    for (size_t i = 0; i < manifest_.tensors.size(); ++i) {
      if (manifest_.tensors[i].file == f.name) in_file.push_back({i, nullptr});
    }
    ASSERT_FALSE(in_file.empty());
    auto bad = reader->read(in_file, /*verify=*/true);
    EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss) << bad.status().to_string();
    EXPECT_NE(bad.status().message().find(f.name), std::string::npos) << bad.status().to_string();
    FP_EXPECT_OK(reader->read(in_file, /*verify=*/false));
  }
  flip_byte(path, 8);  // restored
  EXPECT_TRUE(verify().ok());

  // The last byte before the data (padding): the header checksum catches it.
  flip_byte(path, f.checksum_bytes - 1, 0x01);
  report = verify();
  EXPECT_FALSE(report.ok());
  EXPECT_TRUE(any_contains(report.problems, "header of " + f.name)) << joined(report.problems);
}

TEST_F(CorruptionTest, DamagedObjectsSidecar) {
  const ManifestFile* f = manifest_.find_file("objects.pkl");
  ASSERT_NE(f, nullptr);
  flip_byte(victim_ + "/objects.pkl", f->size / 2);
  FP_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::open(victim_, engine_));
  auto objects = reader->read_objects();
  EXPECT_EQ(objects.status().code(), StatusCode::kDataLoss) << objects.status().to_string();
  EXPECT_NE(objects.status().message().find("objects.pkl"), std::string::npos);
  EXPECT_TRUE(any_contains(verify().problems, "objects.pkl")) << joined(verify().problems);
  // The tensors are fine.
  FP_EXPECT_OK(reader->read(all_requests(), true));
}

TEST_F(CorruptionTest, FlippedBytesInEveryTensorAreAllReported) {
  size_t nonempty = 0;
  for (const ManifestTensor& t : manifest_.tensors) {
    if (t.length == 0) continue;
    ++nonempty;
    flip_byte(victim_ + "/" + t.file, t.offset + t.length - 1);
  }
  VerifyReport report = verify();
  EXPECT_EQ(report.problems.size(), nonempty) << joined(report.problems);
  for (const ManifestTensor& t : manifest_.tensors) {
    if (t.length > 0) {
      EXPECT_TRUE(any_contains(report.problems, "'" + t.name + "'")) << t.name;
    }
  }
}

}  // namespace
}  // namespace fastpersist::testing
