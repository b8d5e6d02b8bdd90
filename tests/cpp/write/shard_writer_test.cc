// SPDX-License-Identifier: Apache-2.0
// The public ShardWriter: the records it returns describe the files it wrote (read back with the
// safetensors reader, checksums recomputed), ranks share a directory (threads and processes),
// staging is reused, a failure leaves no file of its own behind, and a manifest made of its
// records verifies like one the manager wrote.
#include "fastpersist/shard_writer.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <set>
#include <thread>

#include "checkpoint/checkpoint_test_util.h"
#include "checkpoint_dir/checkpoint_fs.h"
#include "fastpersist/checksum.h"
#include "fastpersist/layout.h"
#include "fastpersist/manifest.h"
#include "fastpersist/safetensors.h"
#include "testing/fault_backend.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"
#include "testing/watchdog.h"

namespace fastpersist::testing {
namespace {

using std::chrono::seconds;

ShardWriterOptions small_writer_options(std::optional<uint32_t> rank = std::nullopt) {
  ShardWriterOptions o;
  static_cast<DataFileOptions&>(o) = small_options();  // several files from ~1 MiB
  o.rank = rank;
  return o;
}

std::unique_ptr<ShardWriter> make_writer(const ShardWriterOptions& o,
                                         std::shared_ptr<IoEngine> engine = nullptr) {
  auto w = ShardWriter::create(o, std::move(engine));
  EXPECT_TRUE(w.is_ok()) << w.status().to_string();
  return w.is_ok() ? std::move(w).value() : nullptr;
}

std::vector<std::string> sorted_names(const std::string& dir) {
  auto names = checkpoint::list_dir(dir);
  EXPECT_TRUE(names.is_ok()) << names.status().to_string();
  std::vector<std::string> out = names.is_ok() ? *names : std::vector<std::string>{};
  std::sort(out.begin(), out.end());
  return out;
}

// Every record against the bytes on disk: each file's size and header checksum, its safetensors
// header (parsed by the library's reader), and each tensor's offset, length, bytes and checksum.
void expect_records_match_files(const std::string& dir, const ShardWriteResult& r,
                                const TestState& state, std::optional<uint32_t> rank) {
  ASSERT_EQ(r.tensors.size(), state.tensors.size());
  uint64_t total = 0;
  std::set<std::string> file_names;
  for (const ManifestFile& f : r.files) {
    SCOPED_TRACE(f.name);
    file_names.insert(f.name);
    EXPECT_TRUE(is_data_file_name(f.name));
    EXPECT_EQ(f.role, "tensors");
    EXPECT_EQ(f.rank, rank);
    FP_ASSERT_OK_AND_ASSIGN(auto bytes, read_whole_file(dir + "/" + f.name));
    ASSERT_EQ(bytes.size(), f.size);
    total += f.size;
    FP_ASSERT_OK_AND_ASSIGN(SafetensorsHeader header, read_safetensors_header(dir + "/" + f.name));
    EXPECT_EQ(header.file_bytes(), f.size);
    EXPECT_EQ(f.checksum_bytes, header.data_start);
    EXPECT_EQ(f.checksum, xxh3_64(bytes.data(), static_cast<size_t>(f.checksum_bytes)));
    for (const ManifestTensor& t : r.tensors) {
      if (t.file != f.name) continue;
      SCOPED_TRACE(t.name);
      auto at = header.find(t.name);
      ASSERT_TRUE(at.has_value()) << "the file's own header names the tensor";
      const SafetensorsTensor& h = header.tensors[*at];
      EXPECT_EQ(t.offset, header.data_start + h.begin);
      EXPECT_EQ(t.length, h.nbytes());
      EXPECT_EQ(t.dtype, h.dtype);
      EXPECT_EQ(t.shape, h.shape);
      ASSERT_LE(t.offset + t.length, bytes.size());
      EXPECT_EQ(t.checksum, xxh3_64(bytes.data() + t.offset, static_cast<size_t>(t.length)));
    }
  }
  EXPECT_EQ(r.bytes_written, total);
  for (size_t i = 0; i < state.tensors.size(); ++i) {
    const ManifestTensor& t = r.tensors[i];
    const OwnedTensor& want = state.tensors[i];
    SCOPED_TRACE(want.name);
    EXPECT_EQ(t.name, want.name) << "records keep the caller's order";
    EXPECT_EQ(t.encoding, kEncodingRaw);
    EXPECT_EQ(t.stored_length, t.length);
    EXPECT_EQ(t.length, want.bytes.size());
    EXPECT_EQ(t.checksum, xxh3_64(want.bytes.data(), want.bytes.size()))
        << "the checksum covers the source bytes";
    EXPECT_EQ(file_names.count(t.file), 1u);
  }
}

// What a distributed coordinator does with the ranks' records: one manifest over all of them,
// written last. The library's own verification must accept it.
void commit_manifest(const std::string& dir, const std::vector<ShardWriteResult>& parts,
                     uint32_t world_size) {
  Manifest m;
  m.tag = "records";
  m.sequence = 1;
  m.world_size = world_size;
  for (const ShardWriteResult& p : parts) {
    m.files.insert(m.files.end(), p.files.begin(), p.files.end());
    m.tensors.insert(m.tensors.end(), p.tensors.begin(), p.tensors.end());
  }
  m.fingerprint = manifest_fingerprint(m.tensors);
  FP_ASSERT_OK(checkpoint::write_new_file(dir + "/" + std::string(kManifestFileName),
                                          encode_manifest(m), false));
}

TEST(ShardWriterTest, RecordsMatchTheFilesTheyDescribe) {
  TempDir dir;
  TestState state = mixed_state(51);
  auto writer = make_writer(small_writer_options());
  ASSERT_NE(writer, nullptr);
  int snapshots = 0;
  ShardWriteCallbacks callbacks;
  callbacks.on_snapshot_done = [&] { ++snapshots; };
  FP_ASSERT_OK_AND_ASSIGN(ShardWriteResult r,
                          writer->write(dir.path(), state.content().tensors, callbacks));
  EXPECT_EQ(snapshots, 1);
  EXPECT_GT(r.files.size(), 1u) << "small target_file_bytes: several files";
  for (size_t i = 0; i < r.files.size(); ++i) {
    EXPECT_EQ(r.files[i].name, data_file_name(i, r.files.size()));
  }
  expect_records_match_files(dir.path(), r, state, std::nullopt);
  commit_manifest(dir.path(), {r}, 1);
  expect_verifies(dir.path());
}

TEST(ShardWriterTest, RankGoesIntoTheFileNamesAndTheRecords) {
  TempDir dir;
  TestState state = mixed_state(52);
  auto writer = make_writer(small_writer_options(7));
  ASSERT_NE(writer, nullptr);
  FP_ASSERT_OK_AND_ASSIGN(ShardPlan plan, writer->plan(state.content().tensors));
  FP_ASSERT_OK_AND_ASSIGN(ShardWriteResult r,
                          writer->write(dir.path(), state.content().tensors, plan));
  ASSERT_EQ(r.files.size(), plan.file_count());
  EXPECT_EQ(r.bytes_written, plan.total_bytes());
  std::vector<std::string> expected;
  for (size_t i = 0; i < r.files.size(); ++i) {
    expected.push_back(data_file_name(i, r.files.size(), 7));
    EXPECT_EQ(r.files[i].name, expected.back());
    EXPECT_EQ(r.files[i].rank, 7u);
  }
  EXPECT_EQ(plan.file_names(), expected);
  EXPECT_EQ(sorted_names(dir.path()), expected);
  expect_records_match_files(dir.path(), r, state, 7u);
}

// Two ranks write into one directory at the same time (threads), each with its own writer and
// staging; then a coordinator's manifest over both verifies.
TEST(ShardWriterTest, TwoRanksWriteIntoOneDirectoryConcurrently) {
  TempDir dir;
  TestState states[2] = {mixed_state(53), mixed_state(54)};
  for (OwnedTensor& t : states[1].tensors) t.name = "rank1." + t.name;  // a DCP plan's own names
  std::unique_ptr<ShardWriter> writers[2] = {make_writer(small_writer_options(0)),
                                             make_writer(small_writer_options(1))};
  ASSERT_NE(writers[0], nullptr);
  ASSERT_NE(writers[1], nullptr);
  Result<ShardWriteResult> results[2] = {Status(StatusCode::kInternal, "not run"),
                                         Status(StatusCode::kInternal, "not run")};
  run_with_watchdog(seconds(60), "two ranks writing one directory", [&] {
    std::atomic<int> ready{0};
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        ready.fetch_add(1);
        while (ready.load() < 2) std::this_thread::yield();  // start together
        results[r] = writers[r]->write(dir.path(), states[r].content().tensors);
      });
    }
    for (auto& t : ranks) t.join();
  });
  std::vector<ShardWriteResult> parts;
  size_t files = 0;
  for (int r = 0; r < 2; ++r) {
    FP_ASSERT_OK(results[r].status());
    expect_records_match_files(dir.path(), *results[r], states[r], static_cast<uint32_t>(r));
    files += results[r]->files.size();
    parts.push_back(*results[r]);
  }
  EXPECT_EQ(sorted_names(dir.path()).size(), files);
  commit_manifest(dir.path(), parts, 2);
  expect_verifies(dir.path());
}

// The same with two processes: no lock, nothing shared but the directory.
TEST(ShardWriterTest, TwoProcessesWriteIntoOneDirectory) {
  TempDir dir;
  pid_t children[2];
  for (uint32_t rank = 0; rank < 2; ++rank) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      TestState state = mixed_state(60 + rank);
      auto writer = ShardWriter::create(small_writer_options(rank));
      if (!writer.is_ok()) _exit(2);
      auto r = (*writer)->write(dir.path(), state.content().tensors);
      _exit(r.is_ok() && r->files.size() > 1 ? 0 : 3);
    }
    children[rank] = pid;
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  }
  // Each rank's files are whole: its own writer's records, made again here, describe them
  // (the bytes are reproducible from the seed).
  for (uint32_t rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    TestState state = mixed_state(60 + rank);
    auto writer = make_writer(small_writer_options(rank));
    ASSERT_NE(writer, nullptr);
    TempDir again;
    FP_ASSERT_OK_AND_ASSIGN(ShardWriteResult r,
                            writer->write(again.path(), state.content().tensors));
    for (const ManifestFile& f : r.files) {
      EXPECT_EQ(read_text(dir.path() + "/" + f.name), read_text(again.path() + "/" + f.name))
          << f.name;
    }
  }
  size_t expected = 0;
  for (const std::string& name : sorted_names(dir.path())) {
    EXPECT_TRUE(name.rfind("tensors-r00000-", 0) == 0 || name.rfind("tensors-r00001-", 0) == 0)
        << name;
    ++expected;
  }
  EXPECT_GT(expected, 2u);
}

// Staging belongs to the writer: a second write reuses the windows of the first. With a budget
// it allocates nothing new; without one (windows made on demand, as many as the writes are
// behind) the two writes together never hold more than one write's worth of windows.
TEST(ShardWriterTest, StagingIsReusedAcrossWrites) {
  TempDir dir;
  TestState state = mixed_state(55);
  for (size_t budget : {size_t{0}, 2 * small_options().staging_window_bytes}) {
    SCOPED_TRACE("budget " + std::to_string(budget));
    ShardWriterOptions o = small_writer_options();
    o.staging_budget_bytes = budget;
    auto writer = make_writer(o);
    ASSERT_NE(writer, nullptr);
    EXPECT_EQ(writer->staging_bytes(), 0u);
    std::string first = dir.file("first-" + std::to_string(budget));
    std::string second = dir.file("second-" + std::to_string(budget));
    ASSERT_EQ(::mkdir(first.c_str(), 0755), 0);
    ASSERT_EQ(::mkdir(second.c_str(), 0755), 0);
    FP_ASSERT_OK(writer->write(first, state.content().tensors).status());
    size_t staged = writer->staging_bytes();
    EXPECT_GT(staged, 0u);
    if (budget != 0) {
      EXPECT_LE(staged, budget);
    }
    FP_ASSERT_OK_AND_ASSIGN(ShardPlan plan, writer->plan(state.content().tensors));
    FP_ASSERT_OK_AND_ASSIGN(ShardWriteResult r,
                            writer->write(second, state.content().tensors, plan));
    if (budget != 0) {
      EXPECT_EQ(writer->staging_bytes(), staged) << "the second write allocated nothing new";
    } else {
      const size_t window = writer->options().staging_window_bytes;
      size_t one_write = 0;
      for (const ManifestFile& f : r.files) one_write += (f.size + window - 1) / window * window;
      EXPECT_LE(writer->staging_bytes(), one_write) << "the second write reused the first's";
    }
    expect_records_match_files(second, r, state, std::nullopt);
    writer->release_staging();
    EXPECT_EQ(writer->staging_bytes(), 0u);
  }
}

// A budget far smaller than one tensor streams the tensor through it and never exceeds it.
TEST(ShardWriterTest, BudgetSmallerThanATensorStreams) {
  TempDir dir;
  TestState state;
  state.add("big", "F32", {1 << 18}, 56);  // 1 MiB
  state.add("small", "U8", {100}, 57);
  ShardWriterOptions o = small_writer_options();
  o.staging_budget_bytes = 3 * 4096;  // below one 64 KiB window: the window shrinks
  auto writer = make_writer(o);
  ASSERT_NE(writer, nullptr);
  EXPECT_EQ(writer->options().staging_window_bytes, 3u * 4096);
  run_with_watchdog(seconds(60), "a tensor 85 times the budget", [&] {
    FP_ASSERT_OK_AND_ASSIGN(ShardWriteResult r, writer->write(dir.path(), state.content().tensors));
    expect_records_match_files(dir.path(), r, state, std::nullopt);
  });
  EXPECT_GT(writer->staging_bytes(), 0u);
  EXPECT_LE(writer->staging_bytes(), o.staging_budget_bytes);
}

// An engine that fails a write in the middle: the first error comes back (errno, path) and not
// one of the writer's files is left; what else was in the directory stays.
TEST(ShardWriterTest, FailingEngineLeavesNoPartialFiles) {
  TempDir dir;
  write_text(dir.file("unrelated.txt"), "kept");
  TestState state = mixed_state(58);
  FP_ASSERT_OK_AND_ASSIGN(
      auto faults,
      FaultInjector::create(
          {.kind = FaultKind::kError, .error = EIO, .nth = 4, .ops = FaultOps::kWrites},
          Backend::kThreads));
  FP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<IoEngine> engine,
                          IoEngine::create(EngineOptions{}, faults->factory(), "faulty threads"));
  auto writer = make_writer(small_writer_options(), engine);
  ASSERT_NE(writer, nullptr);
  int snapshots = 0;
  ShardWriteCallbacks callbacks;
  callbacks.on_snapshot_done = [&] { ++snapshots; };
  auto r = writer->write(dir.path(), state.content().tensors, callbacks);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIoError) << r.status().to_string();
  EXPECT_EQ(r.status().sys_errno(), EIO);
  EXPECT_NE(r.status().path().find(std::string(kDataFilePrefix)), std::string::npos)
      << r.status().to_string();
  EXPECT_FALSE(faults->injected().empty());
  EXPECT_LE(snapshots, 1);
  EXPECT_EQ(sorted_names(dir.path()), std::vector<std::string>{"unrelated.txt"});
  EXPECT_EQ(read_text(dir.file("unrelated.txt")), "kept");

  // The same writer succeeds once the disk is healthy again, into the same directory.
  faults->disarm();
  FP_ASSERT_OK_AND_ASSIGN(ShardWriteResult ok, writer->write(dir.path(), state.content().tensors));
  expect_records_match_files(dir.path(), ok, state, std::nullopt);
}

// A name another writer already has (e.g. two writers without ranks): kAlreadyExists, the
// other's file is untouched, and this write's other files are gone.
TEST(ShardWriterTest, NameCollisionKeepsTheOtherFileAndRemovesOwnFiles) {
  TempDir dir;
  TestState state = mixed_state(59);
  auto writer = make_writer(small_writer_options(3));
  ASSERT_NE(writer, nullptr);
  FP_ASSERT_OK_AND_ASSIGN(ShardPlan plan, writer->plan(state.content().tensors));
  ASSERT_GT(plan.file_count(), 1u);
  const std::string taken = plan.file_names().back();
  write_text(dir.file(taken), "someone else's");
  auto r = writer->write(dir.path(), state.content().tensors, plan);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kAlreadyExists) << r.status().to_string();
  EXPECT_EQ(sorted_names(dir.path()), std::vector<std::string>{taken});
  EXPECT_EQ(read_text(dir.file(taken)), "someone else's");
}

TEST(ShardWriterTest, EmptyTensorListWritesNothing) {
  TempDir dir;
  auto writer = make_writer(small_writer_options(2));
  ASSERT_NE(writer, nullptr);
  int snapshots = 0;
  ShardWriteCallbacks callbacks;
  callbacks.on_snapshot_done = [&] { ++snapshots; };
  FP_ASSERT_OK_AND_ASSIGN(ShardWriteResult r, writer->write(dir.path(), {}, callbacks));
  EXPECT_TRUE(r.files.empty());
  EXPECT_TRUE(r.tensors.empty());
  EXPECT_EQ(r.bytes_written, 0u);
  EXPECT_EQ(snapshots, 1) << "nothing to stage: the snapshot is done at once";
  EXPECT_TRUE(sorted_names(dir.path()).empty());
  EXPECT_EQ(writer->staging_bytes(), 0u);
}

TEST(ShardWriterTest, RefusesAPlanOfOtherTensorsAndBadOptions) {
  TempDir dir;
  TestState state = mixed_state(61);
  auto writer = make_writer(small_writer_options());
  ASSERT_NE(writer, nullptr);
  FP_ASSERT_OK_AND_ASSIGN(ShardPlan plan, writer->plan(state.content().tensors));
  std::vector<TensorSource> fewer = state.content().tensors;
  fewer.pop_back();
  EXPECT_EQ(writer->write(dir.path(), fewer, plan).status().code(), StatusCode::kInvalidArgument);
  std::vector<TensorSource> renamed = state.content().tensors;
  renamed[0].name = "other";
  EXPECT_EQ(writer->write(dir.path(), renamed, plan).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(writer->write(dir.path(), state.content().tensors, ShardPlan{}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(sorted_names(dir.path()).empty());

  std::vector<TensorSource> twice = state.content().tensors;
  twice.push_back(twice.front());
  EXPECT_EQ(writer->plan(twice).status().code(), StatusCode::kInvalidArgument);

  ShardWriterOptions bad = small_writer_options();
  bad.staging_window_bytes = 5000;
  EXPECT_EQ(ShardWriter::create(bad).status().code(), StatusCode::kInvalidArgument);
  bad = small_writer_options();
  bad.staging_budget_bytes = 100;
  EXPECT_EQ(ShardWriter::create(bad).status().code(), StatusCode::kInvalidArgument);
  // Settings that would start a thread count nobody meant, or say nothing, are bad input.
  auto refused = [](const ShardWriterOptions& o, const std::string& needle) {
    Status st = ShardWriter::create(o).status();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.to_string();
  };
  bad = small_writer_options();
  bad.max_parallel_files = 0;
  refused(bad, "max_parallel_files must be 1 to 1024, got 0");
  bad = small_writer_options();
  bad.compression_threads = 1000000000;
  refused(bad, "compression_threads must be 0 (one per core) to 1024");
  bad = small_writer_options();
  bad.compression_level = 99;  // without a codec
  refused(bad, "compression_level 99 was given without a compression codec");
}

// A write into a directory that does not exist fails cleanly (ENOENT, the path).
TEST(ShardWriterTest, MissingDirectoryIsAnError) {
  TempDir dir;
  TestState state = mixed_state(62);
  auto writer = make_writer(small_writer_options());
  ASSERT_NE(writer, nullptr);
  auto r = writer->write(dir.file("absent"), state.content().tensors);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().to_string();
  EXPECT_NE(r.status().path().find("absent"), std::string::npos);
}

}  // namespace
}  // namespace fastpersist::testing
