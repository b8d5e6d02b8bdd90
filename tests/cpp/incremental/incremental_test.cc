// SPDX-License-Identifier: Apache-2.0
// Incremental checkpoints end to end (CheckpointOptions::incremental): unchanged tensors stored
// as references to the last full checkpoint, bit-identical loads of both, full_every, the
// more-than-half rule, retention and remove() keeping a referenced base (with the reasons a dry
// run prints), a reopened manager going on from its base, compression underneath, and a
// missing or damaged base reported instead of loaded.
#include <gtest/gtest.h>

#include <span>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_test_util.h"
#include "checkpoint/retention.h"
#include "checkpoint/root_scan.h"
#include "checkpoint_dir/checkpoint_fs.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/checksum.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace fastpersist::testing {
namespace {

CheckpointOptions incremental_options(unsigned full_every = 10) {
  CheckpointOptions o = small_options();
  o.incremental = true;
  o.full_every = full_every;
  o.compression_threads = 2;
  return o;
}

// A fine-tuning step: the adapter and one bias change; the rest (the frozen base) does not.
void train_step(TestState* s, uint64_t seed) {
  for (OwnedTensor& t : s->tensors) {
    if (t.name == "model.layer1.bias" || t.name == "odd.u8")
      t.bytes = random_bytes(t.bytes.size(), seed);
  }
}

class IncrementalTest : public ::testing::Test {
 protected:
  void open(const CheckpointOptions& o) {
    auto m = CheckpointManager::open(root_.path(), o);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    mgr_ = std::move(m).value();
  }
  // Saves and returns the base the save referenced ("" for a full checkpoint).
  std::string save(const std::string& tag, const TestState& s) {
    return save_and_wait(*mgr_, tag, s);
  }
  void expect_loads(const std::string& tag, const TestState& s) {
    auto reader = CheckpointReader::open(root_.file(tag), engine_);
    ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
    FP_ASSERT_OK_AND_ASSIGN(LoadResult r, (*reader)->load(LoadRequest{}));
    const Manifest& m = (*reader)->manifest();
    for (const OwnedTensor& t : s.tensors) {
      size_t i = m.find_tensor(t.name).value();
      long k = r.loaded_index.at(i);
      ASSERT_GE(k, 0) << t.name;
      const LoadedTensor& lt = r.tensors[static_cast<size_t>(k)];
      std::span<const std::byte> got;
      if (lt.buffer != nullptr)
        got = {lt.buffer->data() + lt.offset, static_cast<size_t>(lt.nbytes)};
      EXPECT_EQ("", first_difference(t.bytes, got)) << tag << " " << t.name;
    }
  }
  Manifest manifest(const std::string& tag) {
    auto m = read_manifest(root_.file(tag));
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    return m.is_ok() ? std::move(m).value() : Manifest{};
  }

  TempDir root_;
  std::shared_ptr<IoEngine> engine_ = make_engine();
  std::unique_ptr<CheckpointManager> mgr_;
};

TEST_F(IncrementalTest, UnchangedTensorsAreReferencesAndBothCheckpointsLoadBitIdentical) {
  open(incremental_options());
  TestState s = mixed_state();
  EXPECT_EQ(save("s1", s), "");
  const TestState first = s;
  train_step(&s, 99);
  auto pending = mgr_->save_async("s2", s.content());
  ASSERT_TRUE(pending.is_ok());
  ASSERT_TRUE(pending->wait().is_ok());
  EXPECT_EQ(pending->base_tag(), "s1");
  const uint64_t changed =
      s.find("model.layer1.bias")->bytes.size() + s.find("odd.u8")->bytes.size();
  EXPECT_EQ(pending->referenced_bytes(), s.total_bytes() - changed);

  Manifest m1 = manifest("s1");
  Manifest m2 = manifest("s2");
  for (const ManifestTensor& t : m1.tensors) {
    if (t.length > 0) {
      EXPECT_TRUE(t.digest.has_value()) << t.name;
    }
  }
  for (const ManifestTensor& t : m2.tensors) {
    const bool is_changed = t.name == "model.layer1.bias" || t.name == "odd.u8";
    const bool referenced = t.file.rfind("s1/", 0) == 0;
    // Empty tensors have no bytes to hash: they are written (in no bytes) every time.
    if (t.length == 0) continue;
    EXPECT_EQ(referenced, !is_changed) << t.name << " in " << t.file;
    if (referenced) {
      const ManifestTensor& b = m1.tensors[m1.find_tensor(t.name).value()];
      EXPECT_EQ(t.offset, b.offset);
      EXPECT_EQ(t.checksum, b.checksum);
      EXPECT_EQ(t.file, "s1/" + b.file);
      EXPECT_NE(m2.find_file(t.file), nullptr) << t.file;
    }
  }
  // Only the changed bytes (and headers, the sidecar, the manifest) were written.
  uint64_t own_bytes = 0;
  for (const ManifestFile& f : m2.files) {
    if (referenced_checkpoint(f).empty() && f.role == "tensors") own_bytes += f.size;
  }
  EXPECT_LT(own_bytes, changed + 64 * kKiB);
  EXPECT_LT(pending->bytes(), s.total_bytes() / 4);

  ASSERT_TRUE(mgr_->close().is_ok());
  expect_loads("s1", first);
  expect_loads("s2", s);
  expect_verifies(root_.file("s1"));
  expect_verifies(root_.file("s2"));
  FP_ASSERT_OK_AND_ASSIGN(auto infos, list_checkpoints(root_.path()));
  ASSERT_EQ(infos.size(), 2u);
  EXPECT_TRUE(infos[0].references.empty());
  EXPECT_EQ(infos[1].references, (std::vector<std::string>{"s1"}));
}

TEST_F(IncrementalTest, FullEveryAndTheHalfRuleDecideWhenASaveIsFull) {
  open(incremental_options(3));
  TestState s = mixed_state();
  EXPECT_EQ(save("s1", s), "");
  train_step(&s, 2);
  EXPECT_EQ(save("s2", s), "s1");
  train_step(&s, 3);
  EXPECT_EQ(save("s3", s), "s1");
  train_step(&s, 4);
  EXPECT_EQ(save("s4", s), "");  // the third save since s1: full_every 3
  train_step(&s, 5);
  EXPECT_EQ(save("s5", s), "s4");
  // Most bytes changed: a full checkpoint, the new base.
  TestState other = mixed_state(1000);
  EXPECT_EQ(save("s6", other), "");
  EXPECT_EQ(save("s7", other), "s6");
  ASSERT_TRUE(mgr_->close().is_ok());
  expect_loads("s5", s);
  expect_loads("s7", other);
}

TEST_F(IncrementalTest, FullEveryOneMakesEverySaveFullAndZeroIsRefused) {
  CheckpointOptions o = incremental_options(0);
  auto bad = CheckpointManager::open(root_.path(), o);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("full_every"), std::string::npos);
  open(incremental_options(1));
  TestState s = mixed_state();
  EXPECT_EQ(save("s1", s), "");
  EXPECT_EQ(save("s2", s), "");
}

TEST_F(IncrementalTest, RetentionKeepsAReferencedBaseAndSaysWhy) {
  CheckpointOptions o = incremental_options();
  o.keep_last = 1;
  open(o);
  TestState s = mixed_state();
  save("s1", s);
  train_step(&s, 2);
  save("s2", s);
  train_step(&s, 3);
  save("s3", s);
  // s2 went; s1 stays: s3 references it.
  EXPECT_EQ(listed_tags(root_.path()), (std::vector<std::string>{"s1", "s3"}));
  FP_ASSERT_OK_AND_ASSIGN(checkpoint::RootScan scan, checkpoint::scan_root(root_.path()));
  checkpoint::RetentionDecision d = checkpoint::decide_retention(scan, 1, std::nullopt);
  EXPECT_TRUE(d.remove.empty());
  ASSERT_EQ(d.kept.size(), 2u);
  EXPECT_EQ(d.kept[0].first, "s1");
  EXPECT_NE(d.kept[0].second.find("the base of s3"), std::string::npos) << d.kept[0].second;
  EXPECT_EQ(d.kept[1].second, "the newest");
  // An explicit prune keeps it too; the loads still work.
  FP_ASSERT_OK_AND_ASSIGN(auto removed, mgr_->prune(1, std::nullopt));
  EXPECT_TRUE(removed.empty());
  ASSERT_TRUE(mgr_->close().is_ok());
  expect_loads("s3", s);
}

TEST_F(IncrementalTest, RemovingAReferencedBaseIsRefusedUntilItsUsersAreGone) {
  open(incremental_options());
  TestState s = mixed_state();
  save("s1", s);
  train_step(&s, 2);
  save("s2", s);
  Status st = mgr_->remove("s1");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("base of incremental checkpoint(s) s2"), std::string::npos)
      << st.to_string();
  EXPECT_TRUE(path_exists(root_.file("s1")));
  expect_loads("s2", s);
  FP_ASSERT_OK(mgr_->remove("s2"));
  FP_ASSERT_OK(mgr_->remove("s1"));
  // The base is gone: the next save is full, and the one after references it.
  EXPECT_EQ(save("s3", s), "");
  EXPECT_EQ(save("s4", s), "s3");
}

TEST_F(IncrementalTest, MaterializeMakesAnIncrementalCheckpointStandalone) {
  open(incremental_options());
  TestState s = mixed_state();
  save("s1", s);
  train_step(&s, 2);
  save("s2", s);
  const Manifest before = manifest("s2");
  FP_ASSERT_OK_AND_ASSIGN(uint64_t copied, mgr_->materialize("s2"));
  EXPECT_GT(copied, 0u);
  const Manifest after = manifest("s2");
  EXPECT_EQ(after.sequence, before.sequence);
  EXPECT_EQ(after.tag, "s2");
  for (const ManifestFile& f : after.files) EXPECT_EQ(referenced_checkpoint(f), "") << f.name;
  ASSERT_EQ(after.tensors.size(), before.tensors.size());
  for (size_t i = 0; i < after.tensors.size(); ++i) {
    EXPECT_EQ(after.tensors[i].checksum, before.tensors[i].checksum);
    EXPECT_EQ(after.tensors[i].offset, before.tensors[i].offset);
  }
  FP_ASSERT_OK_AND_ASSIGN(uint64_t again, mgr_->materialize("s2"));
  EXPECT_EQ(again, 0u);
  // Nothing references s1 any more: it can go, and s2 still loads and verifies.
  FP_ASSERT_OK(mgr_->remove("s1"));
  expect_loads("s2", s);
  expect_verifies(root_.file("s2"));
  EXPECT_EQ(mgr_->materialize("nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(mgr_->materialize("../x").status().code(), StatusCode::kInvalidArgument);
}

TEST_F(IncrementalTest, AReopenedManagerGoesOnFromTheBaseAndCountsTheSavesSinceIt) {
  open(incremental_options(3));
  TestState s = mixed_state();
  save("s1", s);
  train_step(&s, 2);
  EXPECT_EQ(save("s2", s), "s1");
  ASSERT_TRUE(mgr_->close().is_ok());
  open(incremental_options(3));
  train_step(&s, 3);
  EXPECT_EQ(save("s3", s), "s1");
  ASSERT_TRUE(mgr_->close().is_ok());
  open(incremental_options(3));
  EXPECT_EQ(save("s4", s), "");  // s2 and s3 counted: this one is full
  ASSERT_TRUE(mgr_->close().is_ok());
  // Without incremental, a manager writes full checkpoints without digests.
  open(small_options());
  EXPECT_EQ(save("s5", s), "");
  ASSERT_TRUE(mgr_->close().is_ok());
  for (const ManifestTensor& t : manifest("s5").tensors) {
    EXPECT_FALSE(t.digest.has_value());
  }
  open(incremental_options(3));
  EXPECT_EQ(save("s6", s), "");  // s5 has no digests to compare with
  EXPECT_EQ(save("s7", s), "s6");
  ASSERT_TRUE(mgr_->close().is_ok());
  // A manager without checksums does not build on a base with them (a referenced tensor keeps
  // the base's checksum, which its manifest would not name).
  CheckpointOptions no_sums = incremental_options(3);
  no_sums.checksums = false;
  open(no_sums);
  EXPECT_EQ(save("s8", s), "");
  EXPECT_EQ(save("s9", s), "s8");
  ASSERT_TRUE(mgr_->close().is_ok());
  expect_verifies(root_.file("s9"));
  expect_loads("s9", s);
}

// A base manifest edited so that a tensor's xxh3_128 names other bytes than its own (its
// checksum left alone): verify reports it, and a reopened manager's next save, whose tensor has
// exactly the forged digest, writes that tensor instead of referencing the base's old bytes.
TEST_F(IncrementalTest, AForgedBaseDigestIsReportedAndNeverReferenced) {
  open(incremental_options());
  TestState s = mixed_state();
  save("s1", s);
  ASSERT_TRUE(mgr_->close().is_ok());
  TestState next = s;
  train_step(&next, 99);  // model.layer1.bias and odd.u8 change
  std::vector<std::byte> changed_bytes;
  for (const OwnedTensor& t : next.tensors) {
    if (t.name == "model.layer1.bias") changed_bytes = t.bytes;
  }
  ASSERT_FALSE(changed_bytes.empty());
  const Manifest base = manifest("s1");
  const ManifestTensor& bias = base.tensors[base.find_tensor("model.layer1.bias").value()];
  ASSERT_TRUE(bias.digest.has_value());
  const std::string old_hex = digest_to_hex(*bias.digest);
  const std::string forged_hex =
      digest_to_hex(xxh3_128(changed_bytes.data(), changed_bytes.size()));
  const std::string path = root_.file("s1") + "/manifest.json";
  FP_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> raw, read_whole_file(path));
  std::string text(reinterpret_cast<const char*>(raw.data()), raw.size());
  const size_t at = text.find(old_hex);
  ASSERT_NE(at, std::string::npos);
  text.replace(at, old_hex.size(), forged_hex);
  FP_ASSERT_OK(write_whole_file(path, std::as_bytes(std::span(text))));

  FP_ASSERT_OK_AND_ASSIGN(VerifyReport report, verify_checkpoint(root_.file("s1"), *engine_));
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_NE(report.problems[0].find("model.layer1.bias"), std::string::npos) << report.problems[0];
  EXPECT_NE(report.problems[0].find("forged"), std::string::npos) << report.problems[0];

  open(incremental_options());
  EXPECT_EQ(save("s2", next), "s1");  // the unchanged tensors are still referenced ...
  const Manifest second = manifest("s2");
  const ManifestTensor& written = second.tensors[second.find_tensor("model.layer1.bias").value()];
  EXPECT_EQ(written.file.find("s1/"), std::string::npos) << written.file;  // ... but not this one
  const ManifestTensor& embed = second.tensors[second.find_tensor("model.embed.weight").value()];
  EXPECT_EQ(embed.file.rfind("s1/", 0), 0u) << embed.file;
  expect_loads("s2", next);
}

TEST_F(IncrementalTest, CompressedBaseTensorsAreReferencedWithTheirEncoding) {
  CheckpointOptions o = incremental_options();
  o.compression = Compression::kZstd;
  open(o);
  TestState s;
  OwnedTensor& w = s.add("w", "F32", {200000}, 1);
  for (size_t i = 3; i < w.bytes.size(); i += 4) w.bytes[i] = std::byte{0x3c};
  s.add("adapter", "F32", {1000}, 2);
  save("s1", s);
  train_step(&s, 3);
  s.tensors[1].bytes = random_bytes(s.tensors[1].bytes.size(), 4);
  EXPECT_EQ(save("s2", s), "s1");
  ASSERT_TRUE(mgr_->close().is_ok());
  Manifest m2 = manifest("s2");
  const ManifestTensor& ref = m2.tensors[m2.find_tensor("w").value()];
  EXPECT_EQ(ref.encoding, "zstd");
  EXPECT_EQ(ref.file.rfind("s1/", 0), 0u);
  expect_loads("s2", s);
  expect_verifies(root_.file("s2"));
}

TEST_F(IncrementalTest, AMissingOrDamagedBaseIsReportedNeverLoaded) {
  open(incremental_options());
  TestState s = mixed_state();
  save("s1", s);
  train_step(&s, 2);
  save("s2", s);
  ASSERT_TRUE(mgr_->close().is_ok());
  // Damage a byte of a referenced tensor in the base: verify of s2 names it, loads refuse it.
  Manifest m2 = manifest("s2");
  const ManifestTensor& ref = m2.tensors[m2.find_tensor("model.embed.weight").value()];
  ASSERT_EQ(ref.file.rfind("s1/", 0), 0u);
  flip_byte(root_.path() + "/" + ref.file, ref.offset + 7);
  FP_ASSERT_OK_AND_ASSIGN(VerifyReport report, verify_checkpoint(root_.file("s2"), *engine_));
  EXPECT_TRUE(any_contains(report.problems, "model.embed.weight")) << joined(report.problems);
  auto reader = CheckpointReader::open(root_.file("s2"), engine_);
  ASSERT_TRUE(reader.is_ok());
  auto loaded = (*reader)->load(LoadRequest{});
  EXPECT_EQ(loaded.status().code(), StatusCode::kDataLoss);
  flip_byte(root_.path() + "/" + ref.file, ref.offset + 7);  // repaired
  expect_loads("s2", s);
  // A base deleted behind the manager's back: s2 is listed as damaged, with the reason.
  FP_ASSERT_OK(checkpoint::remove_tree(root_.file("s1")));
  std::vector<std::string> skipped;
  FP_ASSERT_OK_AND_ASSIGN(auto infos, list_checkpoints(root_.path(), &skipped));
  EXPECT_TRUE(infos.empty());
  EXPECT_TRUE(any_contains(skipped, "s2")) << joined(skipped);
  EXPECT_FALSE(CheckpointReader::open(root_.file("s2"), engine_).is_ok());
  // A new manager starts over with a full checkpoint.
  open(incremental_options());
  EXPECT_EQ(save("s3", s), "");
}

}  // namespace
}  // namespace fastpersist::testing
