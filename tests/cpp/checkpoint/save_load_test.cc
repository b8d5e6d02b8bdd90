// SPDX-License-Identifier: Apache-2.0
// Round trip: a state of many dtypes and sizes (empty, scalar, odd byte counts, tensors larger
// than a staging window) saved across several data files, read back with and without
// destinations, verified; the data files are valid, aligned safetensors that agree with the
// manifest; listing and the latest pointer follow the commit order.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <set>

#include "checkpoint/checkpoint_test_util.h"
#include "checkpoint/save_job.h"
#include "checkpoint_dir/checkpoint_fs.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/manifest.h"
#include "fastpersist/safetensors.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"
#include "testing/watchdog.h"

namespace fastpersist::testing {
namespace {

using std::chrono::seconds;

class SaveLoadTest : public ::testing::Test {
 protected:
  std::string root() const { return dir_.file("ckpts"); }
  // Saves `state` as checkpoint "a" under root() and opens a reader on it.
  void save_and_open(const TestState& state, std::unique_ptr<CheckpointReader>* reader) {
    FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(root(), small_options()));
    FP_ASSERT_OK(mgr->save("a", state.content()));
    FP_ASSERT_OK(mgr->close());
    auto engine = make_engine();
    ASSERT_NE(engine, nullptr);
    FP_ASSERT_OK_AND_ASSIGN(*reader, CheckpointReader::open(root() + "/a", engine));
  }
  TempDir dir_;
};

TEST_F(SaveLoadTest, MixedStateRoundTripsAcrossSeveralFiles) {
  TestState state = mixed_state();
  run_with_watchdog(seconds(60), "save and load a mixed state", [&] {
    FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(root(), small_options()));
    FP_ASSERT_OK(mgr->save("step-1234", state.content()));
    std::string dir = root() + "/step-1234";
    expect_checkpoint_matches(dir, state, /*verify=*/true);
    expect_checkpoint_matches(dir, state, /*verify=*/false);

    FP_ASSERT_OK_AND_ASSIGN(Manifest m, read_manifest(dir));
    EXPECT_EQ(m.tag, "step-1234");
    EXPECT_EQ(m.sequence, 1u);
    EXPECT_EQ(m.metadata_json, state.metadata_json);
    EXPECT_EQ(m.checksum_algorithm, "xxh3-64");
    EXPECT_EQ(m.versions.count("fastpersist"), 1u);
    EXPECT_EQ(m.tensor_bytes(), state.total_bytes());
    EXPECT_FALSE(m.fingerprint.empty());
    size_t data_files = 0;
    for (const ManifestFile& f : m.files) data_files += f.role == "tensors" ? 1 : 0;
    EXPECT_GE(data_files, 3u) << "a ~1 MiB state with 256 KiB files makes several files";
    EXPECT_NE(m.find_file("objects.pkl"), nullptr);
    FP_ASSERT_OK(mgr->close());
  });
}

TEST_F(SaveLoadTest, ReadIntoDestinationsAndSpansMixed) {
  TestState state = mixed_state(7);
  std::unique_ptr<CheckpointReader> reader;
  ASSERT_NO_FATAL_FAILURE(save_and_open(state, &reader));
  const Manifest& m = reader->manifest();

  // Every tensor into the caller's memory (misaligned on purpose for odd ones), bounded.
  for (uint64_t bound : {uint64_t{0}, uint64_t{100} * kKiB, uint64_t{1}}) {
    SCOPED_TRACE("max_in_flight_bytes " + std::to_string(bound));
    std::vector<TestBuffer> dest;
    std::vector<TensorReadRequest> requests;
    for (size_t i = 0; i < m.tensors.size(); ++i) {
      dest.emplace_back(std::max<size_t>(m.tensors[i].length, 1), i % 2);
      requests.push_back({i, dest.back().data(), std::max<uint64_t>(m.tensors[i].length, 1)});
    }
    FP_ASSERT_OK_AND_ASSIGN(auto result, reader->read(requests, /*verify=*/true, bound));
    for (size_t i = 0; i < m.tensors.size(); ++i) {
      const OwnedTensor* want = state.find(m.tensors[i].name);
      ASSERT_NE(want, nullptr);
      EXPECT_EQ(result.spans[i], nullptr);
      EXPECT_EQ(result.data[i], dest[i].data());
      EXPECT_EQ("", first_difference(want->bytes, std::span<const std::byte>(dest[i].data(),
                                                                             want->bytes.size())))
          << m.tensors[i].name;
    }
  }

  // Half into spans (no gaps allowed: one span per tensor), half into destinations, reversed.
  std::vector<TestBuffer> dest;
  std::vector<TensorReadRequest> requests;
  for (size_t k = m.tensors.size(); k-- > 0;) {
    if (k % 2 == 0) {
      dest.emplace_back(std::max<size_t>(m.tensors[k].length, 1), 0);
      requests.push_back({k, dest.back().data(), m.tensors[k].length});
    } else {
      requests.push_back({k, nullptr});
    }
  }
  FP_ASSERT_OK_AND_ASSIGN(auto result,
                          reader->read(requests, /*verify=*/true, 0, /*max_gap_bytes=*/0));
  for (size_t r = 0; r < requests.size(); ++r) {
    const ManifestTensor& t = m.tensors[requests[r].tensor];
    const OwnedTensor* want = state.find(t.name);
    ASSERT_NE(want, nullptr);
    if (t.length == 0) continue;
    ASSERT_NE(result.data[r], nullptr) << t.name;
    if (requests[r].destination == nullptr) {
      ASSERT_NE(result.spans[r], nullptr) << t.name;
      const LoadedSpan& s = *result.spans[r];
      EXPECT_EQ(s.file, t.file);
      EXPECT_EQ(s.file_offset % 4096, 0u);
      EXPECT_EQ(result.data[r], s.buffer->data() + s.buffer_offset + (t.offset - s.file_offset));
      // Page-aligned buffers + 4096-aligned file offsets: the element alignment carries over.
      size_t elem = *safetensors_dtype_size(t.dtype);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(result.data[r]) % elem, 0u) << t.name;
    }
    EXPECT_EQ("",
              first_difference(want->bytes, std::span<const std::byte>(result.data[r], t.length)))
        << t.name;
  }

  // A subset, and an index out of range.
  FP_ASSERT_OK_AND_ASSIGN(auto one, reader->read({{0, nullptr}}, true));
  EXPECT_EQ(one.data.size(), 1u);
  auto bad = reader->read({{m.tensors.size(), nullptr}}, true);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  FP_ASSERT_OK_AND_ASSIGN(auto none, reader->read({}, true));
  EXPECT_TRUE(none.data.empty());
}

// read_pieces: every tensor streamed in pieces of several sizes (smaller and larger than the
// tensors, at file offsets that are not page-aligned) gives its exact bytes, in order; a
// flipped byte fails verification after the last piece; a sink error stops the stream.
TEST_F(SaveLoadTest, ReadPiecesStreamsEveryTensorInOrder) {
  TestState state = mixed_state(9);
  std::unique_ptr<CheckpointReader> reader;
  ASSERT_NO_FATAL_FAILURE(save_and_open(state, &reader));
  const Manifest& m = reader->manifest();
  for (uint64_t piece : {uint64_t{4096}, uint64_t{12288}, uint64_t{64} * kKiB, uint64_t{1} << 20}) {
    for (size_t i = 0; i < m.tensors.size(); ++i) {
      const ManifestTensor& t = m.tensors[i];
      SCOPED_TRACE(t.name + ", pieces of " + std::to_string(piece));
      std::vector<std::byte> got;
      size_t calls = 0;
      FP_ASSERT_OK(reader->read_pieces(i, piece, /*verify=*/true,
                                       [&](uint64_t offset, const std::byte* data, size_t size) {
                                         EXPECT_EQ(offset, got.size());
                                         EXPECT_LE(size, piece);
                                         EXPECT_GT(size, 0u);
                                         got.insert(got.end(), data, data + size);
                                         ++calls;
                                         return Status::ok();
                                       }));
      const OwnedTensor* want = state.find(t.name);
      ASSERT_NE(want, nullptr);
      EXPECT_EQ("", first_difference(want->bytes, got));
      EXPECT_EQ(calls, (t.length + piece - 1) / piece);
    }
  }
  auto noop = [](uint64_t, const std::byte*, size_t) { return Status::ok(); };
  EXPECT_EQ(reader->read_pieces(0, 1000, true, noop).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(reader->read_pieces(0, 0, true, noop).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(reader->read_pieces(m.tensors.size(), 4096, true, noop).code(),
            StatusCode::kInvalidArgument);

  // The sink's error is returned and no further piece is delivered.
  size_t biggest = 0;
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    if (m.tensors[i].length > m.tensors[biggest].length) biggest = i;
  }
  size_t delivered = 0;
  Status stop = reader->read_pieces(biggest, 4096, true, [&](uint64_t, const std::byte*, size_t) {
    return ++delivered == 3 ? Status(StatusCode::kInternal, "sink gives up") : Status::ok();
  });
  EXPECT_EQ(stop.message(), "sink gives up");
  EXPECT_EQ(delivered, 3u);

  // One flipped byte in the middle of the biggest tensor: verified streams fail naming it.
  const ManifestTensor& t = m.tensors[biggest];
  flip_byte(root() + "/a/" + t.file, t.offset + t.length / 2);
  Status damaged = reader->read_pieces(biggest, 8192, true, noop);
  EXPECT_EQ(damaged.code(), StatusCode::kDataLoss) << damaged.to_string();
  EXPECT_NE(damaged.message().find("'" + t.name + "'"), std::string::npos) << damaged.to_string();
  FP_EXPECT_OK(reader->read_pieces(biggest, 8192, false, noop));
}

TEST_F(SaveLoadTest, DataFilesAreAlignedSafetensorsThatAgreeWithTheManifest) {
  TestState state = mixed_state(3);
  FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(root(), small_options()));
  FP_ASSERT_OK(mgr->save("st", state.content()));
  std::string dir = root() + "/st";
  FP_ASSERT_OK_AND_ASSIGN(Manifest m, read_manifest(dir));
  std::set<std::string> seen;
  for (const ManifestFile& f : m.files) {
    std::string path = dir + "/" + f.name;
    FP_ASSERT_OK_AND_ASSIGN(uint64_t size, file_size(path));
    EXPECT_EQ(size, f.size) << f.name;
    if (f.role != "tensors") {
      EXPECT_EQ(f.role, "objects");
      EXPECT_EQ(f.name, "objects.pkl");
      EXPECT_EQ(read_text(path), state.objects);
      continue;
    }
    EXPECT_EQ(f.name.rfind("tensors-", 0), 0u) << f.name;
    FP_ASSERT_OK_AND_ASSIGN(SafetensorsHeader h, read_safetensors_header(path));
    EXPECT_EQ(h.data_start % 4096, 0u) << f.name;
    EXPECT_EQ(h.data_start, f.checksum_bytes) << f.name;
    EXPECT_EQ(h.file_bytes(), f.size) << f.name;
    EXPECT_EQ(h.metadata.at("format"), "pt");
    size_t in_manifest = 0;
    for (const ManifestTensor& t : m.tensors) in_manifest += t.file == f.name ? 1 : 0;
    EXPECT_EQ(h.tensors.size(), in_manifest) << f.name;
    for (const SafetensorsTensor& ht : h.tensors) {
      auto k = m.find_tensor(ht.name);
      ASSERT_TRUE(k.has_value()) << ht.name;
      const ManifestTensor& t = m.tensors[*k];
      EXPECT_TRUE(seen.insert(ht.name).second) << ht.name << " in two files";
      EXPECT_EQ(t.file, f.name) << ht.name;
      EXPECT_EQ(t.dtype, ht.dtype) << ht.name;
      EXPECT_EQ(t.shape, ht.shape) << ht.name;
      EXPECT_EQ(t.offset, h.data_start + ht.begin) << ht.name;
      EXPECT_EQ(t.length, ht.nbytes()) << ht.name;
      size_t elem = *safetensors_dtype_size(ht.dtype);
      EXPECT_EQ(t.offset % elem, 0u) << ht.name << " is not aligned to its element size";
      EXPECT_EQ(ht.begin % elem, 0u) << ht.name;
    }
  }
  EXPECT_EQ(seen.size(), state.tensors.size());
}

TEST_F(SaveLoadTest, ListLatestAndVerifyFollowTheCommitOrder) {
  TestState state = mixed_state(11);
  FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(root(), small_options()));
  // Tags in an order that differs from their names' order.
  for (const char* tag : {"zeta", "alpha", "mid.1"}) FP_ASSERT_OK(mgr->save(tag, state.content()));
  FP_ASSERT_OK_AND_ASSIGN(auto infos, list_checkpoints(root()));
  EXPECT_EQ(tags_of(infos), (std::vector<std::string>{"zeta", "alpha", "mid.1"}));
  for (size_t i = 0; i < infos.size(); ++i) {
    EXPECT_EQ(infos[i].sequence, i + 1);
    EXPECT_EQ(infos[i].step, state.step);
    EXPECT_EQ(infos[i].num_tensors, state.tensors.size());
    EXPECT_EQ(infos[i].tensor_bytes, state.total_bytes());
    EXPECT_GT(infos[i].total_bytes, infos[i].tensor_bytes);
    EXPECT_GT(infos[i].created_unix, 1.6e9);
  }
  FP_ASSERT_OK_AND_ASSIGN(auto via_manager, mgr->list());
  EXPECT_EQ(tags_of(via_manager), tags_of(infos));
  FP_ASSERT_OK_AND_ASSIGN(auto latest, latest_checkpoint(root()));
  EXPECT_EQ(latest, std::optional<std::string>("mid.1"));
  EXPECT_EQ(read_text(root() + "/latest"), "mid.1\n");
  for (const char* tag : {"zeta", "alpha", "mid.1"}) {
    uint64_t last_done = 0, last_total = 0;
    FP_ASSERT_OK_AND_ASSIGN(
        VerifyReport report,
        verify_checkpoint(root() + "/" + tag, mgr->engine(), [&](uint64_t d, uint64_t t) {
          EXPECT_GE(d, last_done);
          last_done = d;
          last_total = t;
        }));
    EXPECT_TRUE(report.ok()) << joined(report.problems);
    EXPECT_EQ(report.bytes_checked, infos[0].total_bytes);
    EXPECT_EQ(last_done, last_total);
  }
  // Nothing but checkpoints, the lock and the pointer is left in the root.
  EXPECT_TRUE(names_with_prefix(root(), ".tmp-").empty());
  EXPECT_TRUE(names_with_prefix(root(), ".trash-").empty());
  EXPECT_TRUE(names_with_prefix(root(), ".latest").empty());
}

TEST_F(SaveLoadTest, DurableSaveWithLockedStagingRoundTrips) {
  TestState state = mixed_state(5);
  CheckpointOptions o = small_options();
  o.durable = true;
  o.lock_staging_memory = true;
  run_with_watchdog(seconds(60), "durable save", [&] {
    FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(root(), o));
    FP_ASSERT_OK_AND_ASSIGN(PendingSave p, mgr->save_async("durable", state.content()));
    FP_ASSERT_OK(p.wait());
    EXPECT_TRUE(p.done());
    EXPECT_TRUE(p.snapshot_done());
    EXPECT_GT(p.bytes(), state.total_bytes());
    EXPECT_GE(p.total_seconds(), p.snapshot_seconds());
    FP_ASSERT_OK(mgr->close());
  });
  expect_checkpoint_matches(root() + "/durable", state);
  auto engine = make_engine();
  ASSERT_NE(engine, nullptr);
  FP_ASSERT_OK_AND_ASSIGN(VerifyReport report, verify_checkpoint(root() + "/durable", *engine));
  EXPECT_TRUE(report.ok()) << joined(report.problems);
}

TEST_F(SaveLoadTest, EmptyStateAndDefaultOptions) {
  // No tensors at all (no data file, only the objects file and the manifest), no objects.
  TestState empty;
  FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(root()));
  FP_ASSERT_OK_AND_ASSIGN(PendingSave p, mgr->save_async("nothing", empty.content()));
  FP_ASSERT_OK(p.wait_snapshot());
  FP_ASSERT_OK(p.wait());
  expect_checkpoint_matches(root() + "/nothing", empty);
  FP_ASSERT_OK_AND_ASSIGN(Manifest none, read_manifest(root() + "/nothing"));
  for (const ManifestFile& f : none.files) EXPECT_NE(f.role, "tensors") << f.name;
  FP_ASSERT_OK_AND_ASSIGN(VerifyReport report,
                          verify_checkpoint(root() + "/nothing", mgr->engine()));
  EXPECT_TRUE(report.ok()) << joined(report.problems);

  // A single tiny tensor with the default (large) windows and files.
  TestState one;
  one.add("w", "F32", {3}, 9);
  FP_ASSERT_OK(mgr->save("one", one.content()));
  expect_checkpoint_matches(root() + "/one", one);
  FP_ASSERT_OK_AND_ASSIGN(Manifest m, read_manifest(root() + "/one"));
  EXPECT_EQ(m.step, std::nullopt);
  EXPECT_EQ(m.metadata_json, "{}");
}

TEST_F(SaveLoadTest, ReopenedRootContinuesTheSequence) {
  TestState state = mixed_state(2);
  {
    FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(root(), small_options()));
    FP_ASSERT_OK(mgr->save("b", state.content()));
    FP_ASSERT_OK(mgr->save("c", state.content()));
  }
  FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(root(), small_options()));
  FP_ASSERT_OK(mgr->save("a", state.content()));
  EXPECT_EQ(listed_tags(root()), (std::vector<std::string>{"b", "c", "a"}));
  FP_ASSERT_OK_AND_ASSIGN(Manifest m, read_manifest(root() + "/a"));
  EXPECT_EQ(m.sequence, 3u);
  FP_ASSERT_OK_AND_ASSIGN(auto latest, latest_checkpoint(root()));
  EXPECT_EQ(latest, std::optional<std::string>("a"));
}

TEST_F(SaveLoadTest, SameShapesSavedTwiceGiveIdenticalDataFiles) {
  // Determinism of the layout: the same content gives byte-identical data files.
  TestState state = mixed_state(4);
  FP_ASSERT_OK_AND_ASSIGN(auto mgr, CheckpointManager::open(root(), small_options()));
  FP_ASSERT_OK(mgr->save("x", state.content()));
  FP_ASSERT_OK(mgr->save("y", state.content()));
  FP_ASSERT_OK_AND_ASSIGN(Manifest mx, read_manifest(root() + "/x"));
  FP_ASSERT_OK_AND_ASSIGN(Manifest my, read_manifest(root() + "/y"));
  ASSERT_EQ(mx.files.size(), my.files.size());
  EXPECT_EQ(mx.fingerprint, my.fingerprint);
  for (const ManifestFile& f : mx.files) {
    EXPECT_EQ(read_text(root() + "/x/" + f.name), read_text(root() + "/y/" + f.name)) << f.name;
  }
}

}  // namespace
}  // namespace fastpersist::testing
