// SPDX-License-Identifier: Apache-2.0
// CheckpointCommit: a checkpoint that several writers (ranks) fill and one manager commits. It is
// invisible until the commit, commits with the manager's protocol (sequence, `latest`,
// retention), refuses records that do not describe the directory exactly, and an abort (or a
// failed commit, or the commit's destruction) leaves the root as it was.
#include "fastpersist/checkpoint_commit.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <thread>

#include "checkpoint/checkpoint_test_util.h"
#include "checkpoint_dir/checkpoint_fs.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/layout.h"
#include "fastpersist/shard_writer.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace fastpersist::testing {
namespace {

std::unique_ptr<CheckpointManager> open_manager(const std::string& root,
                                                CheckpointOptions o = small_options()) {
  auto m = CheckpointManager::open(root, o);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return m.is_ok() ? std::move(m).value() : nullptr;
}

ShardWriteResult write_rank(const std::string& dir, const TestState& state, uint32_t rank) {
  ShardWriterOptions o;
  static_cast<DataFileOptions&>(o) = small_options();
  o.rank = rank;
  auto writer = ShardWriter::create(o);
  EXPECT_TRUE(writer.is_ok()) << writer.status().to_string();
  auto r = (*writer)->write(dir, state.content().tensors);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? std::move(r).value() : ShardWriteResult{};
}

// Two ranks' states: rank 0 holds rows [0, 4) of "w" (global shape 8 x 1024), rank 1 rows
// [4, 8), and each rank some tensors of its own.
struct TwoRanks {
  TestState rank0, rank1;
  TwoRanks() {
    rank0.add("w[0:4]", "F32", {4, 1024}, 1);
    rank0.add("a", "BF16", {300, 1000}, 2);
    rank1.add("w[4:8]", "F32", {4, 1024}, 3);
    rank1.add("b", "I64", {70000}, 4);
    rank1.add("empty", "F16", {0}, 5);
  }
};

// What a coordinator does: writes both ranks (in parallel, as two processes would), plus one
// sidecar, and gathers the records into the content to commit.
CommitContent write_two_ranks(const std::string& dir, const TwoRanks& s) {
  ShardWriteResult r0, r1;
  std::thread t0([&] { r0 = write_rank(dir, s.rank0, 0); });
  std::thread t1([&] { r1 = write_rank(dir, s.rank1, 1); });
  t0.join();
  t1.join();
  CommitContent c;
  c.world_size = 2;
  c.step = 7;
  c.metadata_json = R"({"job":"two ranks"})";
  for (ShardWriteResult* r : {&r0, &r1}) {
    c.files.insert(c.files.end(), r->files.begin(), r->files.end());
    for (ManifestTensor t : r->tensors) {
      if (t.name.rfind("w[", 0) == 0) {
        t.global_shape = {8, 1024};
        t.shard_offsets = {t.name == "w[0:4]" ? 0u : 4u, 0};
      }
      c.tensors.push_back(std::move(t));
    }
  }
  auto sidecar =
      write_sidecar_file(dir, dcp_objects_file_name(1), "rank one's objects", true, true, 1);
  EXPECT_TRUE(sidecar.is_ok()) << sidecar.status().to_string();
  if (sidecar.is_ok()) c.files.push_back(*sidecar);
  return c;
}

TEST(CheckpointCommitTest, TwoRanksCommitAsOneCheckpoint) {
  TempDir root;
  auto manager = open_manager(root.path());
  ASSERT_NE(manager, nullptr);
  FP_ASSERT_OK(manager->save("single", mixed_state(9).content()));
  TwoRanks s;
  FP_ASSERT_OK_AND_ASSIGN(auto commit, manager->begin_commit("step-7"));
  EXPECT_EQ(commit->tag(), "step-7");
  EXPECT_EQ(
      commit->directory().rfind(root.path() + "/" + std::string(kTempDirPrefix) + "step-7-", 0),
      0u);
  CommitContent content = write_two_ranks(commit->directory(), s);
  EXPECT_EQ(listed_tags(root.path()), std::vector<std::string>{"single"})
      << "invisible before the commit";
  FP_ASSERT_OK(commit->commit(content));
  EXPECT_TRUE(commit->finished());
  EXPECT_FALSE(path_exists(commit->directory()));

  EXPECT_EQ(listed_tags(root.path()), (std::vector<std::string>{"single", "step-7"}));
  EXPECT_EQ(read_text(root.path() + "/latest"), "step-7\n");
  std::string dir = root.path() + "/step-7";
  FP_ASSERT_OK_AND_ASSIGN(Manifest m, read_manifest(dir));
  EXPECT_EQ(m.world_size, 2u);
  EXPECT_EQ(m.sequence, 2u) << "the manager's next sequence";
  EXPECT_EQ(m.step, std::optional<int64_t>(7));
  EXPECT_EQ(m.versions.count("fastpersist"), 1u);
  const ManifestTensor& w1 = m.tensors[*m.find_tensor("w[4:8]")];
  EXPECT_EQ(w1.global_shape, (std::vector<uint64_t>{8, 1024}));
  EXPECT_EQ(w1.shard_offsets, (std::vector<uint64_t>{4, 0}));
  const ManifestFile* sidecar = m.find_file(dcp_objects_file_name(1));
  ASSERT_NE(sidecar, nullptr);
  EXPECT_EQ(sidecar->rank, std::optional<uint32_t>(1));
  EXPECT_EQ(read_text(dir + "/" + sidecar->name), "rank one's objects");
  expect_verifies(dir);

  // Every tensor of both ranks reads back with its bytes.
  FP_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::open(dir, make_engine()));
  for (const TestState* state : {&s.rank0, &s.rank1}) {
    for (const OwnedTensor& t : state->tensors) {
      auto index = reader->manifest().find_tensor(t.name);
      ASSERT_TRUE(index.has_value()) << t.name;
      FP_ASSERT_OK_AND_ASSIGN(auto read, reader->read({{*index, nullptr}}, true));
      if (t.bytes.empty()) continue;
      EXPECT_EQ("",
                first_difference(t.bytes, std::span<const std::byte>(read.data[0], t.bytes.size())))
          << t.name;
    }
  }
}

TEST(CheckpointCommitTest, AbortLeavesTheRootAsItWas) {
  TempDir root;
  auto manager = open_manager(root.path());
  ASSERT_NE(manager, nullptr);
  TwoRanks s;
  {
    FP_ASSERT_OK_AND_ASSIGN(auto commit, manager->begin_commit("t"));
    (void)write_two_ranks(commit->directory(), s);
    EXPECT_EQ(manager->remove("t").code(), StatusCode::kBusy) << "the tag is being saved";
    FP_ASSERT_OK(commit->abort());
    FP_ASSERT_OK(commit->abort());  // idempotent
    EXPECT_FALSE(path_exists(commit->directory()));
    EXPECT_EQ(commit->commit({}).code(), StatusCode::kInvalidArgument) << "over after an abort";
  }
  {
    // Destroying an open commit aborts it too.
    FP_ASSERT_OK_AND_ASSIGN(auto commit, manager->begin_commit("t"));
    (void)write_two_ranks(commit->directory(), s);
    std::string dir = commit->directory();
    commit.reset();
    EXPECT_FALSE(path_exists(dir));
  }
  EXPECT_TRUE(listed_tags(root.path()).empty());
  EXPECT_FALSE(path_exists(root.path() + "/latest"));
  EXPECT_TRUE(names_with_prefix(root.path(), std::string(kTempDirPrefix)).empty());
  FP_ASSERT_OK_AND_ASSIGN(auto again, manager->begin_commit("t"));  // the tag is free
  FP_ASSERT_OK(again->abort());
}

TEST(CheckpointCommitTest, RefusesRecordsThatDoNotDescribeTheDirectory) {
  TempDir root;
  auto manager = open_manager(root.path());
  ASSERT_NE(manager, nullptr);
  TwoRanks s;
  struct Case {
    const char* what;
    std::function<void(CommitContent&, const std::string& dir)> damage;
    StatusCode code;
    const char* message;
  };
  std::vector<Case> cases = {
      {"a rank's records lost",
       [](CommitContent& c, const std::string&) {
         std::string lost = c.files.front().name;
         c.files.erase(c.files.begin());
         std::erase_if(c.tensors, [&](const ManifestTensor& t) { return t.file == lost; });
       },
       StatusCode::kInvalidArgument, "no writer reported it"},
      {"a file truncated",
       [](CommitContent& c, const std::string& dir) {
         ASSERT_EQ(::truncate((dir + "/" + c.files[0].name).c_str(), 100), 0);
       },
       StatusCode::kDataLoss, "checkpoint file"},
      {"a rank beyond the world", [](CommitContent& c, const std::string&) { c.world_size = 1; },
       StatusCode::kInvalidArgument, "rank"},
      {"a block outside its global shape",
       [](CommitContent& c, const std::string&) {
         for (ManifestTensor& t : c.tensors) {
           if (!t.shard_offsets.empty()) t.shard_offsets[0] = 6;
         }
       },
       StatusCode::kInvalidArgument, "shard_offsets"},
      {"metadata that is not an object",
       [](CommitContent& c, const std::string&) { c.metadata_json = "[1]"; },
       StatusCode::kInvalidArgument, "JSON object"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    FP_ASSERT_OK_AND_ASSIGN(auto commit, manager->begin_commit("t"));
    CommitContent c = write_two_ranks(commit->directory(), s);
    k.damage(c, commit->directory());
    Status st = commit->commit(c);
    EXPECT_EQ(st.code(), k.code) << st.to_string();
    EXPECT_NE(st.message().find(k.message), std::string::npos) << st.to_string();
    EXPECT_TRUE(commit->finished());
    EXPECT_FALSE(path_exists(commit->directory())) << "a failed commit removes the directory";
    EXPECT_TRUE(listed_tags(root.path()).empty());
  }
}

TEST(CheckpointCommitTest, TagsAlreadyCommittedOrPendingAreRefused) {
  TempDir root;
  auto manager = open_manager(root.path());
  ASSERT_NE(manager, nullptr);
  FP_ASSERT_OK(manager->save("done", mixed_state(2).content()));
  EXPECT_EQ(manager->begin_commit("done").status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(manager->begin_commit("../x").status().code(), StatusCode::kInvalidArgument);
  FP_ASSERT_OK_AND_ASSIGN(auto first, manager->begin_commit("t"));
  EXPECT_EQ(manager->begin_commit("t").status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(manager->save("t", mixed_state(3).content()).code(), StatusCode::kAlreadyExists);
  // A tag committed by someone else meanwhile: the rename never replaces it.
  FP_ASSERT_OK_AND_ASSIGN(auto other, manager->begin_commit("u"));
  FP_ASSERT_OK(first->abort());
  ASSERT_EQ(::mkdir((root.path() + "/u").c_str(), 0755), 0);
  Status st = other->commit({});
  EXPECT_EQ(st.code(), StatusCode::kAlreadyExists) << st.to_string();
}

TEST(CheckpointCommitTest, RetentionAppliesAfterTheCommit) {
  TempDir root;
  CheckpointOptions o = small_options();
  o.keep_last = 1;
  auto manager = open_manager(root.path(), o);
  ASSERT_NE(manager, nullptr);
  FP_ASSERT_OK(manager->save("old", mixed_state(2).content()));
  TwoRanks s;
  FP_ASSERT_OK_AND_ASSIGN(auto commit, manager->begin_commit("new"));
  FP_ASSERT_OK(commit->commit(write_two_ranks(commit->directory(), s)));
  FP_EXPECT_OK(commit->retention_error());
  EXPECT_EQ(listed_tags(root.path()), std::vector<std::string>{"new"});
}

TEST(CheckpointCommitTest, ACommitOutlivingItsManagerOnlyAborts) {
  TempDir root;
  auto manager = open_manager(root.path());
  ASSERT_NE(manager, nullptr);
  TwoRanks s;
  FP_ASSERT_OK_AND_ASSIGN(auto commit, manager->begin_commit("t"));
  CommitContent c = write_two_ranks(commit->directory(), s);
  FP_ASSERT_OK(manager->close());
  Status st = commit->commit(c);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("closed"), std::string::npos);
  EXPECT_FALSE(path_exists(commit->directory())) << "the failed commit aborted";
  manager.reset();

  // The lock was released: another manager opens, begins a commit, and is destroyed first.
  auto second_manager = open_manager(root.path());
  ASSERT_NE(second_manager, nullptr);
  FP_ASSERT_OK_AND_ASSIGN(auto second, second_manager->begin_commit("t"));
  (void)write_two_ranks(second->directory(), s);
  second_manager.reset();
  EXPECT_EQ(second->commit({}).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(path_exists(second->directory()));
  EXPECT_TRUE(listed_tags(root.path()).empty());
}

TEST(CheckpointCommitTest, SidecarFilesNeedPlainNewNames) {
  TempDir dir;
  EXPECT_EQ(write_sidecar_file(dir.path(), "a/b", "x", false, true).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(write_sidecar_file(dir.path(), "..", "x", false, true).status().code(),
            StatusCode::kInvalidArgument);
  FP_ASSERT_OK_AND_ASSIGN(ManifestFile f,
                          write_sidecar_file(dir.path(), "s.bin", "abc", false, false, 3));
  EXPECT_EQ(f.checksum, 0u);
  EXPECT_EQ(f.size, 3u);
  EXPECT_EQ(f.role, "objects");
  EXPECT_EQ(write_sidecar_file(dir.path(), "s.bin", "other", false, true).status().code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(read_text(dir.path() + "/s.bin"), "abc");
}

}  // namespace
}  // namespace fastpersist::testing
