// SPDX-License-Identifier: Apache-2.0
// Object-store tiers (object_store.h, object_tier.h): a manager drains into a store through the
// ObjectStore interface (here a directory-backed store with fault injection; the real S3 server
// is tested from Python): files in parallel parts, checked on the way, the manifest last as the
// commit marker; retention in the store; pulls back with every byte checked; a damaged local
// copy never uploaded; an unreachable store never failing a local save; what a drain that died
// left removed; verification of a stored checkpoint.
#include "tier/object_tier.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_test_util.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/object_store.h"
#include "testing/dir_object_store.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"
#include "tier/part_upload.h"
#include "tier/tier_drain.h"

namespace fastpersist::testing {
namespace {

constexpr uint64_t kPart = uint64_t{5} << 20;  // the smallest part a tier takes

// About 13 MiB in one file (three parts) plus the small mixed tensors.
TestState big_state(int64_t step) {
  TestState s = mixed_state(static_cast<uint64_t>(step));
  s.add("model.big.weight", "F32", {13 * 1024 * 1024 / 4 + 77}, static_cast<uint64_t>(step) + 100);
  s.step = step;
  return s;
}

class ObjectTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = std::make_shared<DirObjectStore>(dir_.file("store"), "test://bucket/run");
  }

  std::string local() const { return dir_.file("local"); }

  TierOptions tier() const {
    TierOptions t;
    t.path = store_->url();
    t.store = store_;
    t.part_bytes = kPart;
    t.transfers = 4;
    return t;
  }
  CheckpointOptions options(std::vector<TierOptions> tiers) const {
    CheckpointOptions o = small_options();
    o.target_file_bytes = 64 * kMiB;  // the big tensor stays one file: a multipart upload
    o.tiers = std::move(tiers);
    return o;
  }
  std::unique_ptr<CheckpointManager> open(const CheckpointOptions& o, const std::string& root) {
    auto m = CheckpointManager::open(root, o);
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    return m.is_ok() ? std::move(m).value() : nullptr;
  }
  std::vector<std::string> tier_tags() {
    checkpoint::ObjectTier t(store_, {kPart, 4});
    auto listed = t.list();
    EXPECT_TRUE(listed.is_ok()) << listed.status().to_string();
    return listed.is_ok() ? tags_of(*listed) : std::vector<std::string>{};
  }
  std::vector<Status> save(CheckpointManager& m, const std::string& tag, const TestState& s) {
    auto pending = m.save_async(tag, s.content());
    EXPECT_TRUE(pending.is_ok()) << pending.status().to_string();
    if (!pending.is_ok()) return {};
    Status st = pending->wait();
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return pending->tier_errors();
  }

  TempDir dir_;
  std::shared_ptr<DirObjectStore> store_;
};

TEST_F(ObjectTierTest, DrainsInPartsCommitsWithTheManifestAndPullsBackIntact) {
  store_->part_delay = std::chrono::milliseconds(30);  // parts overlap long enough to be seen
  std::vector<TestState> states{big_state(1), big_state(2)};
  {
    auto m = open(options({tier()}), local());
    ASSERT_NE(m, nullptr);
    EXPECT_TRUE(save(*m, "s1", states[0]).empty());
    EXPECT_TRUE(save(*m, "s2", states[1]).empty());
    FP_ASSERT_OK(m->wait_drains());
    FP_ASSERT_OK(m->close());
  }
  EXPECT_EQ(joined(tier_tags()), joined({"s1", "s2"}));
  EXPECT_EQ(store_->read("latest"), "s2");
  EXPECT_GE(store_->parts_uploaded.load(), 6u) << "13 MiB files in 5 MiB parts";
  EXPECT_GE(store_->most_parts_in_flight.load(), 2) << "parts go up in parallel";
  EXPECT_TRUE(store_->open_uploads().empty());
  // The stored manifest is the local one, byte for byte.
  EXPECT_EQ(store_->read("s2/manifest.json"), read_text(local() + "/s2/manifest.json"));

  // The local disk is lost: a new manager on an empty root pulls from the tier, every byte
  // checked, and the checkpoint loads as saved.
  const std::string fresh = dir_.file("fresh");
  auto m = open(options({tier()}), fresh);
  ASSERT_NE(m, nullptr);
  FP_ASSERT_OK_AND_ASSIGN(std::vector<CheckpointPlace> places, m->locations());
  ASSERT_EQ(places.size(), 2u);
  EXPECT_FALSE(places[1].local);
  EXPECT_EQ(places[1].roots, std::vector<std::string>{store_->url()});
  FP_ASSERT_OK_AND_ASSIGN(uint64_t bytes, m->pull(store_->url(), "s2"));
  EXPECT_GT(bytes, states[1].total_bytes());
  expect_checkpoint_matches(fresh + "/s2", states[1]);
  FP_ASSERT_OK(m->close());
}

TEST_F(ObjectTierTest, KeepsItsOwnRetentionAndSendsIncrementalBasesFirst) {
  TierOptions t = tier();
  t.keep_last = 2;
  CheckpointOptions o = options({t});
  o.incremental = true;
  auto m = open(o, local());
  ASSERT_NE(m, nullptr);
  TestState s = big_state(1);
  for (int64_t step = 1; step <= 4; ++step) {
    s.step = step;
    s.tensors[0].bytes[0] = static_cast<std::byte>(step);  // one small tensor changes each time
    EXPECT_TRUE(save(*m, "s" + std::to_string(step), s).empty());
  }
  FP_ASSERT_OK(m->wait_drains());
  FP_ASSERT_OK(m->close());
  std::vector<std::string> there = tier_tags();
  // The newest two, and the full checkpoint they reference (kept as their base).
  ASSERT_GE(there.size(), 2u);
  EXPECT_EQ(there[there.size() - 1], "s4");
  EXPECT_EQ(there[there.size() - 2], "s3");
  checkpoint::ObjectTier objects(store_, {kPart, 4});
  FP_ASSERT_OK_AND_ASSIGN(checkpoint::RootScan scan, objects.scan());
  EXPECT_TRUE(scan.damaged.empty()) << scan.damaged.front().reason;
  for (const CheckpointInfo& c : scan.committed) {
    for (const std::string& base : c.references) {
      EXPECT_NE(std::find(there.begin(), there.end(), base), there.end())
          << c.tag << " lost its base " << base;
    }
  }
  // Verified in the store, an incremental checkpoint is whole: its base is committed there
  // (the scratch copy holds the base's manifest, not only the files referenced).
  auto engine = make_engine();
  const std::string scratch = dir_.file("scratch");
  ASSERT_EQ(::mkdir(scratch.c_str(), 0700), 0);
  FP_ASSERT_OK_AND_ASSIGN(VerifyReport verified,
                          checkpoint::verify_object_checkpoint(objects, "s4", scratch, *engine));
  EXPECT_TRUE(verified.ok()) << verified.problems.front();
  // Pulled back into a new root (bases first), the newest loads as saved.
  const std::string fresh = dir_.file("fresh");
  auto back = open(options({tier()}), fresh);
  ASSERT_NE(back, nullptr);
  FP_ASSERT_OK(back->pull(store_->url(), "s4").status());
  expect_checkpoint_matches(fresh + "/s4", s);
  FP_ASSERT_OK(back->close());
}

// A stored incremental checkpoint whose manifest claims, for bytes it references in its base,
// another checksum than the base records (forged, the fingerprint made to match) is refused by
// a pull before it commits: it would otherwise be committed locally and fail every load.
TEST_F(ObjectTierTest, APullRefusesReferencesTheBaseDoesNotRecord) {
  TierOptions t = tier();
  CheckpointOptions o = options({t});
  o.incremental = true;
  TestState s = big_state(1);
  {
    auto m = open(o, local());
    ASSERT_NE(m, nullptr);
    EXPECT_TRUE(save(*m, "s1", s).empty());
    s.tensors[0].bytes[0] = std::byte{0x5a};  // one small tensor changes: the rest is referenced
    EXPECT_TRUE(save(*m, "s2", s).empty());
    FP_ASSERT_OK(m->wait_drains());
    FP_ASSERT_OK(m->close());
  }
  checkpoint::ObjectTier objects(store_, {kPart, 4});
  FP_ASSERT_OK_AND_ASSIGN(Manifest forged, objects.read_manifest("s2"));
  auto referenced =
      std::find_if(forged.tensors.begin(), forged.tensors.end(),
                   [](const ManifestTensor& x) { return x.file.find('/') != std::string::npos; });
  ASSERT_NE(referenced, forged.tensors.end()) << "s2 references s1";
  referenced->checksum ^= 1;
  forged.fingerprint = manifest_fingerprint(forged.tensors);
  store_->write("s2/manifest.json", encode_manifest(forged));

  const std::string fresh = dir_.file("fresh");
  auto m = open(options({tier()}), fresh);
  ASSERT_NE(m, nullptr);
  FP_ASSERT_OK(m->pull(store_->url(), "s1").status());
  auto pulled = m->pull(store_->url(), "s2");
  ASSERT_FALSE(pulled.is_ok());
  EXPECT_EQ(pulled.status().code(), StatusCode::kDataLoss) << pulled.status().to_string();
  EXPECT_NE(pulled.status().message().find("is not what checkpoint 's1' records there"),
            std::string::npos)
      << pulled.status().to_string();
  EXPECT_EQ(joined(listed_tags(fresh)), joined({"s1"})) << "nothing forged is committed";
  FP_ASSERT_OK(m->close());
}

TEST_F(ObjectTierTest, ADamagedLocalCopyIsNeverUploaded) {
  CheckpointOptions plain = options({});
  TestState s = big_state(1);
  {
    auto m = open(plain, local());
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(save_and_wait(*m, "s1", s), "");
    FP_ASSERT_OK(m->close());
  }
  FP_ASSERT_OK_AND_ASSIGN(Manifest manifest, read_manifest(local() + "/s1"));
  std::optional<size_t> found = manifest.find_tensor("model.big.weight");
  ASSERT_TRUE(found.has_value());
  const ManifestTensor* big = &manifest.tensors[*found];
  flip_byte(local() + "/s1/" + big->file, big->offset + 9 * kMiB);
  checkpoint::ObjectTier objects(store_, {kPart, 4});
  auto engine = make_engine();
  auto up = objects.upload(local(), "s1", *engine);
  ASSERT_FALSE(up.is_ok());
  EXPECT_EQ(up.status().code(), StatusCode::kDataLoss) << up.status().to_string();
  EXPECT_NE(up.status().message().find("model.big.weight"), std::string::npos)
      << up.status().message();
  EXPECT_TRUE(tier_tags().empty());
  FP_ASSERT_OK_AND_ASSIGN(std::vector<ObjectEntry> left, store_->list(""));
  EXPECT_TRUE(left.empty()) << left.front().key << ": a failed upload leaves nothing";
  EXPECT_TRUE(store_->open_uploads().empty());
}

TEST_F(ObjectTierTest, AnUnreachableStoreNeverFailsALocalSaveAndIsRetried) {
  store_->unreachable = true;
  auto m = open(options({tier()}), local());
  ASSERT_NE(m, nullptr);
  TestState s = big_state(1);
  save(*m, "s1", s);  // commits locally
  Status waited = m->wait_drains(5.0);
  EXPECT_FALSE(waited.is_ok());
  EXPECT_NE(waited.to_string().find("connection refused"), std::string::npos) << waited.to_string();
  EXPECT_EQ(joined(listed_tags(local())), joined({"s1"}));
  std::vector<Status> reported = [&] {
    TestState s2 = big_state(2);
    return save(*m, "s2", s2);
  }();
  EXPECT_FALSE(reported.empty()) << "the next save reports the failed drain";
  store_->unreachable = false;  // it comes back: the retry drains both
  FP_ASSERT_OK(m->wait_drains(30.0));
  EXPECT_EQ(joined(tier_tags()), joined({"s1", "s2"}));
  FP_ASSERT_OK(m->close());
}

// std::bad_alloc thrown inside a drain pass (memory ran out in the store's client) is that
// pass's failure, reported like any other; the process goes on (no std::terminate) and the
// next pass drains.
TEST_F(ObjectTierTest, MemoryRunningOutInADrainIsAFailureNotAnAbort) {
  store_->out_of_memory = true;
  auto m = open(options({tier()}), local());
  ASSERT_NE(m, nullptr);
  TestState s = mixed_state(1);
  save(*m, "s1", s);  // commits locally
  Status waited = m->wait_drains();
  ASSERT_FALSE(waited.is_ok());
  EXPECT_EQ(waited.sys_errno(), ENOMEM) << waited.to_string();
  EXPECT_NE(waited.to_string().find("a drain pass ran out of memory"), std::string::npos)
      << waited.to_string();
  store_->out_of_memory = false;
  FP_ASSERT_OK(m->wait_drains());
  EXPECT_EQ(joined(tier_tags()), joined({"s1"}));
  FP_ASSERT_OK(m->close());
}

TEST_F(ObjectTierTest, WhatADrainThatDiedLeftIsRemovedAndNeverListed) {
  TestState s = big_state(1);
  {
    auto m = open(options({}), local());
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(save_and_wait(*m, "s1", s), "");
    FP_ASSERT_OK(m->close());
  }
  // A drain killed half-way: one file up, one upload unfinished, no manifest.
  store_->write("s1/tensors-00000-of-00001.safetensors", "partial");
  FP_ASSERT_OK(store_->begin_upload("s1/other.safetensors").status());
  EXPECT_TRUE(tier_tags().empty()) << "no manifest, no checkpoint";
  FP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<checkpoint::TierTarget> target,
                          checkpoint::open_tier_target(tier(), small_options()));
  FP_ASSERT_OK_AND_ASSIGN(std::vector<ObjectEntry> left, store_->list(""));
  EXPECT_TRUE(left.empty());
  EXPECT_TRUE(store_->open_uploads().empty());
  auto engine = make_engine();
  FP_ASSERT_OK_AND_ASSIGN(checkpoint::CopyResult copied,
                          target->receive(local(), "s1", *engine, {}));
  EXPECT_TRUE(copied.copied);
  FP_ASSERT_OK_AND_ASSIGN(checkpoint::CopyResult again,
                          target->receive(local(), "s1", *engine, {}));
  EXPECT_FALSE(again.copied) << "already there: not sent twice";
  FP_ASSERT_OK(target->close());
}

TEST_F(ObjectTierTest, VerifyFindsDamageInTheStoreAndAPullRefusesIt) {
  TestState s = big_state(1);
  {
    auto m = open(options({tier()}), local());
    ASSERT_NE(m, nullptr);
    EXPECT_TRUE(save(*m, "s1", s).empty());
    FP_ASSERT_OK(m->wait_drains());
    FP_ASSERT_OK(m->close());
  }
  checkpoint::ObjectTier objects(store_, {kPart, 4});
  auto engine = make_engine();
  const std::string scratch = dir_.file("scratch");
  ASSERT_EQ(::mkdir(scratch.c_str(), 0700), 0);
  FP_ASSERT_OK_AND_ASSIGN(VerifyReport intact,
                          checkpoint::verify_object_checkpoint(objects, "s1", scratch, *engine));
  EXPECT_TRUE(intact.ok()) << intact.problems.front();
  EXPECT_GT(intact.bytes_checked, s.total_bytes());

  FP_ASSERT_OK_AND_ASSIGN(Manifest manifest, objects.read_manifest("s1"));
  std::optional<size_t> found = manifest.find_tensor("model.big.weight");
  ASSERT_TRUE(found.has_value());
  const ManifestTensor* big = &manifest.tensors[*found];
  const std::string key = "s1/" + big->file;
  std::string bytes = store_->read(key);
  bytes[static_cast<size_t>(big->offset + 7 * kMiB)] ^= 0x20;
  store_->write(key, bytes);
  FP_ASSERT_OK_AND_ASSIGN(VerifyReport damaged,
                          checkpoint::verify_object_checkpoint(objects, "s1", scratch, *engine));
  ASSERT_FALSE(damaged.ok());
  EXPECT_TRUE(any_contains(damaged.problems, "model.big.weight")) << damaged.problems.front();
  EXPECT_TRUE(names_with_prefix(scratch, ".fp-verify-").empty()) << "the scratch copy is removed";

  const std::string fresh = dir_.file("fresh");
  auto m = open(options({tier()}), fresh);
  ASSERT_NE(m, nullptr);
  auto pulled = m->pull(store_->url(), "s1");
  ASSERT_FALSE(pulled.is_ok());
  EXPECT_EQ(pulled.status().code(), StatusCode::kDataLoss) << pulled.status().to_string();
  EXPECT_TRUE(listed_tags(fresh).empty()) << "nothing damaged is committed locally";
  FP_ASSERT_OK(m->close());

  // The damaged object's size changed too: scan() alone sees that.
  store_->write(key, bytes.substr(0, bytes.size() - 1));
  FP_ASSERT_OK_AND_ASSIGN(checkpoint::RootScan scan, objects.scan());
  EXPECT_TRUE(scan.committed.empty());
  ASSERT_EQ(scan.damaged.size(), 1u);
  EXPECT_NE(scan.damaged[0].reason.find("the manifest says"), std::string::npos)
      << scan.damaged[0].reason;
}

// A listing is untrusted: one that claims a 3 GiB manifest for an object of a few KiB makes no
// 3 GiB allocation (the manifest is fetched in pieces that grow only as bytes arrive) and is
// reported as damage, by read_manifest and by scan().
TEST_F(ObjectTierTest, AListingThatClaimsAHugeManifestAllocatesNothingOfIt) {
  TestState s = mixed_state(1);
  {
    auto m = open(options({tier()}), local());
    ASSERT_NE(m, nullptr);
    EXPECT_TRUE(save(*m, "s1", s).empty());
    FP_ASSERT_OK(m->wait_drains());
    FP_ASSERT_OK(m->close());
  }
  store_->manifest_size_lie = uint64_t{3} << 30;
  store_->largest_get = 0;
  checkpoint::ObjectTier objects(store_, {kPart, 4});
  auto read = objects.read_manifest("s1");
  ASSERT_FALSE(read.is_ok());
  EXPECT_EQ(read.status().code(), StatusCode::kDataLoss) << read.status().to_string();
  EXPECT_NE(read.status().message().find("the object ends before"), std::string::npos)
      << read.status().to_string();
  FP_ASSERT_OK_AND_ASSIGN(checkpoint::RootScan scan, objects.scan());
  EXPECT_TRUE(scan.committed.empty());
  EXPECT_EQ(scan.damaged.size(), 1u);
  EXPECT_LE(store_->largest_get.load(), uint64_t{4} << 20) << "a get sized by the listing's claim";
  store_->manifest_size_lie = 0;
  FP_EXPECT_OK(objects.read_manifest("s1").status());
}

TEST_F(ObjectTierTest, AFailedPartAbortsTheUploadAndRemovesWhatWasSent) {
  TestState s = big_state(1);
  {
    auto m = open(options({}), local());
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(save_and_wait(*m, "s1", s), "");
    FP_ASSERT_OK(m->close());
  }
  FP_ASSERT_OK_AND_ASSIGN(Manifest manifest, read_manifest(local() + "/s1"));
  std::optional<size_t> found = manifest.find_tensor("model.big.weight");
  ASSERT_TRUE(found.has_value());
  const ManifestTensor* big = &manifest.tensors[*found];
  store_->fail_key = big->file;
  checkpoint::ObjectTier objects(store_, {kPart, 4});
  auto engine = make_engine();
  auto up = objects.upload(local(), "s1", *engine);
  ASSERT_FALSE(up.is_ok());
  EXPECT_NE(up.status().message().find("injected failure"), std::string::npos)
      << up.status().to_string();
  store_->fail_key.clear();
  EXPECT_TRUE(store_->open_uploads().empty());
  FP_ASSERT_OK_AND_ASSIGN(std::vector<ObjectEntry> left, store_->list(""));
  EXPECT_TRUE(left.empty()) << left.front().key;
}

TEST_F(ObjectTierTest, RemovalDeletesTheManifestFirstAndKeepsReferencedBases) {
  CheckpointOptions o = options({});
  o.incremental = true;
  TestState s = big_state(1);
  {
    auto m = open(o, local());
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(save_and_wait(*m, "s1", s), "");
    s.tensors[0].bytes[0] = std::byte{7};
    EXPECT_EQ(save_and_wait(*m, "s2", s), "s1") << "incremental: s1 is its base";
    FP_ASSERT_OK(m->close());
  }
  checkpoint::ObjectTier objects(store_, {kPart, 4});
  auto engine = make_engine();
  auto early = objects.upload(local(), "s2", *engine);
  ASSERT_FALSE(early.is_ok()) << "its base is not there yet";
  EXPECT_EQ(early.status().code(), StatusCode::kDataLoss);
  FP_ASSERT_OK(objects.upload(local(), "s1", *engine).status());
  FP_ASSERT_OK(objects.upload(local(), "s2", *engine).status());
  Status busy = objects.remove("s1");
  EXPECT_EQ(busy.code(), StatusCode::kBusy) << busy.to_string();
  FP_ASSERT_OK(objects.remove("s2"));
  FP_ASSERT_OK(objects.remove("s1"));
  FP_ASSERT_OK_AND_ASSIGN(std::vector<ObjectEntry> left, store_->list(""));
  EXPECT_TRUE(left.empty()) << left.front().key;
  EXPECT_EQ(objects.remove("s1").code(), StatusCode::kNotFound);
}

TEST(ObjectStoreKeys, RelativeKeysOnly) {
  FP_EXPECT_OK(ObjectStore::check_key("s1/tensors-00000-of-00001.safetensors"));
  for (const std::string bad : {"", "/abs", "a//b", "a/../b", "..", "./a", "a/", "a\nb"}) {
    EXPECT_EQ(ObjectStore::check_key(bad).code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_TRUE(is_object_store_url("s3://bucket/run"));
  EXPECT_TRUE(is_object_store_url("gs://b"));
  EXPECT_FALSE(is_object_store_url("/mnt/tier"));
  EXPECT_FALSE(is_object_store_url("relative/path"));
  EXPECT_FALSE(is_object_store_url("://x"));
  EXPECT_FALSE(is_object_store_url("a b://x"));
}

TEST(ObjectStoreOpener, WithoutOneAUrlSaysWhatIsMissing) {
  set_object_store_opener({});
  auto opened = open_object_store("s3://bucket/run");
  ASSERT_FALSE(opened.is_ok());
  EXPECT_EQ(opened.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(opened.status().message().find("boto3"), std::string::npos)
      << opened.status().message();
  TierOptions t;
  t.path = "s3://bucket/run";
  EXPECT_TRUE(t.is_object_store());
  t.part_bytes = 1 << 20;
  EXPECT_EQ(t.validate().code(), StatusCode::kInvalidArgument);
  t.part_bytes = kPart;
  t.transfers = 0;
  EXPECT_EQ(t.validate().code(), StatusCode::kInvalidArgument);
  t.transfers = 65;
  EXPECT_EQ(t.validate().code(), StatusCode::kInvalidArgument);
  t.transfers = 8;
  FP_EXPECT_OK(t.validate());
  // Two tiers on one URL are refused; a URL is never compared with directories.
  EXPECT_EQ(checkpoint::check_tiers("/tmp/root", {t, t}).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fastpersist::testing

namespace fastpersist::testing {
namespace {

TEST(PartUploaderTest, ObjectsOfEverySizeArriveWhole) {
  TempDir dir;
  DirObjectStore store(dir.file("store"), "test://bucket");
  const uint64_t part = uint64_t{1} << 20;
  // Empty, smaller than a part, exactly one part, exactly three, and a tail: fed in odd pieces,
  // one object after another without waiting (their parts overlap).
  const std::vector<uint64_t> sizes{0, 1000, part, 3 * part, 3 * part + 12345};
  checkpoint::PartUploader up(store, part, 3);
  std::vector<std::string> expected;
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::string bytes(static_cast<size_t>(sizes[i]), '\0');
    for (size_t k = 0; k < bytes.size(); ++k) bytes[k] = static_cast<char>((k * 131 + i) & 0xff);
    expected.push_back(bytes);
    FP_ASSERT_OK(up.begin("o" + std::to_string(i), sizes[i]));
    for (size_t off = 0; off < bytes.size(); off += 77777) {
      size_t n = std::min<size_t>(77777, bytes.size() - off);
      FP_ASSERT_OK(up.feed(reinterpret_cast<const std::byte*>(bytes.data() + off), n));
    }
    FP_ASSERT_OK(up.end());
  }
  FP_ASSERT_OK(up.finish_all());
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(store.read("o" + std::to_string(i)), expected[i]) << "object " << i;
  }
  EXPECT_EQ(store.parts_uploaded.load(), 3u + 4u) << "objects of one part are single puts";
  EXPECT_TRUE(store.open_uploads().empty());
}

TEST(PartUploaderTest, MisuseAndFailuresAreErrorsNotHangs) {
  TempDir dir;
  DirObjectStore store(dir.file("store"), "test://bucket");
  const uint64_t part = uint64_t{1} << 20;
  checkpoint::PartUploader up(store, part, 2);
  EXPECT_EQ(up.feed(nullptr, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(up.begin("../x", 1).code(), StatusCode::kInvalidArgument);
  FP_ASSERT_OK(up.begin("a", 10));
  EXPECT_EQ(up.begin("b", 10).code(), StatusCode::kInvalidArgument) << "a is not ended";
  std::string ten(10, 'x');
  FP_ASSERT_OK(up.feed(reinterpret_cast<const std::byte*>(ten.data()), 5));
  EXPECT_EQ(up.end().code(), StatusCode::kInternal) << "5 of 10 bytes fed";
  up.abort_all();

  store.fail_key = "bad";
  checkpoint::PartUploader failing(store, part, 2);
  std::string big(static_cast<size_t>(4 * part), 'y');
  FP_ASSERT_OK(failing.begin("bad-object", big.size()));
  Status st;
  for (size_t off = 0; off < big.size() && st.is_ok(); off += part) {
    st = failing.feed(reinterpret_cast<const std::byte*>(big.data() + off),
                      static_cast<size_t>(part));
  }
  if (st.is_ok()) st = failing.end();
  if (st.is_ok()) st = failing.finish_all();
  EXPECT_FALSE(st.is_ok());
  failing.abort_all();
  store.fail_key.clear();
  EXPECT_TRUE(store.open_uploads().empty());
  EXPECT_EQ(store.read("bad-object"), "");
}

TEST(PartUploaderTest, AHugeObjectGetsLargerParts) {
  const uint64_t mib = uint64_t{1} << 20;
  EXPECT_EQ(checkpoint::part_size_for(100 * mib, 32 * mib), 32 * mib);
  EXPECT_EQ(checkpoint::part_size_for(0, 32 * mib), 32 * mib);
  // 1 TiB in at most 10,000 parts: 105 MiB parts (the next whole MiB above 104.86).
  const uint64_t tib = uint64_t{1} << 40;
  uint64_t p = checkpoint::part_size_for(tib, 32 * mib);
  EXPECT_EQ(p, 105 * mib);
  EXPECT_LE((tib + p - 1) / p, checkpoint::kMaxPartsPerObject);
}

}  // namespace
}  // namespace fastpersist::testing
