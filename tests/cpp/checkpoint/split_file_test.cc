// SPDX-License-Identifier: Apache-2.0
// Split files (split_file.h): a serialized stream stored as a skeleton plus U8 tensors reads
// back byte for byte: compressed, and incremental against a base chosen by the commit (the
// pieces that did not change become references, the base cannot be removed meanwhile). A
// damaged skeleton is refused with kDataLoss before anything is allocated.
#include "fastpersist/split_file.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "checkpoint/checkpoint_test_util.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_commit.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/checksum.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"
#include "testing/test_util.h"

namespace fastpersist::testing {
namespace {

// One serialized "file": a header, two lent storages with copied bytes between them, a trailer.
struct FakeFile {
  std::string name;
  std::vector<std::byte> storage_a, storage_b;
  std::vector<std::byte> header = random_bytes(300, 11), middle = random_bytes(4000, 12),
                         trailer = random_bytes(9, 13);

  FakeFile(std::string n, uint64_t seed) : name(std::move(n)) {
    storage_a = random_bytes(size_t{300} << 10, seed);
    storage_b.assign(size_t{200} << 10, std::byte{7});  // compresses well
  }
  std::unique_ptr<DeferredFileWriter> record(const std::string& dir) const {
    auto w = DeferredFileWriter::create(dir, name);
    EXPECT_TRUE(w.is_ok()) << w.status().to_string();
    (*w)->borrow(storage_a.data(), storage_a.size());
    (*w)->borrow(storage_b.data(), storage_b.size());
    EXPECT_TRUE((*w)->write(header.data(), header.size()).is_ok());
    EXPECT_TRUE((*w)->write(storage_a.data(), storage_a.size()).is_ok());
    EXPECT_TRUE((*w)->write(middle.data(), middle.size()).is_ok());
    EXPECT_TRUE((*w)->write(storage_b.data(), storage_b.size()).is_ok());
    EXPECT_TRUE((*w)->write(trailer.data(), trailer.size()).is_ok());
    return std::move(w).value();
  }
  std::vector<std::byte> bytes() const {
    std::vector<std::byte> out;
    for (const auto* part : {&header, &storage_a, &middle, &storage_b, &trailer}) {
      out.insert(out.end(), part->begin(), part->end());
    }
    return out;
  }
};

CheckpointOptions options(Compression c, bool incremental) {
  CheckpointOptions o = small_options();
  o.compression = c;
  o.incremental = incremental;
  return o;
}

// Commits `files` as tag `tag` through `manager` (one rank); returns the commit's base tag.
std::string commit_split(CheckpointManager& manager, const std::string& tag,
                         const std::vector<const FakeFile*>& files,
                         SplitWriteResult* result = nullptr) {
  auto commit = manager.begin_commit(tag);
  EXPECT_TRUE(commit.is_ok()) << commit.status().to_string();
  ShardWriterOptions wo;
  static_cast<DataFileOptions&>(wo) = manager.options();
  wo.content_digests = manager.options().incremental;
  auto writer = ShardWriter::create(wo);
  EXPECT_TRUE(writer.is_ok());
  std::vector<std::unique_ptr<DeferredFileWriter>> writers;
  std::vector<DeferredFileWriter*> raw;
  for (const FakeFile* f : files) {
    writers.push_back(f->record((*commit)->directory()));
    raw.push_back(writers.back().get());
  }
  std::string base = (*commit)->base_tag();
  std::optional<SplitBase> split_base;
  if (!base.empty()) split_base = SplitBase{manager.root(), base};
  auto written = write_split_files((*commit)->directory(), raw, **writer, split_base);
  EXPECT_TRUE(written.is_ok()) << written.status().to_string();
  CommitContent c;
  c.files = written->files;
  c.tensors = written->tensors;
  EXPECT_TRUE((*commit)->commit(std::move(c)).is_ok());
  if (result != nullptr) *result = *written;
  return base;
}

std::vector<std::byte> read_back(const std::string& dir, const std::string& name) {
  auto reader = CheckpointReader::open(dir, make_engine());
  EXPECT_TRUE(reader.is_ok()) << reader.status().to_string();
  auto split = SplitFileReader::open(**reader, name);
  EXPECT_TRUE(split.is_ok()) << split.status().to_string();
  if (!split.is_ok()) return {};
  std::vector<std::byte> out(split->size());
  Status st = split->read_into(out.data(), out.size(), true);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return out;
}

TEST(SplitFile, CompressedFilesReadBackByteForByte) {
  TempDir root;
  FakeFile a("mp_rank_00_model_states.pt", 1), b("optim_states.pt", 2);
  auto manager = CheckpointManager::open(root.path(), options(Compression::kZstd, false));
  FP_ASSERT_OK(manager.status());
  SplitWriteResult r;
  EXPECT_EQ(commit_split(**manager, "global_step1", {&a, &b}, &r), "");
  EXPECT_EQ(r.tensors.size(), 4u);
  EXPECT_EQ(r.tensors[0].name, "mp_rank_00_model_states.pt#0");
  EXPECT_EQ(r.tensors[1].name, "mp_rank_00_model_states.pt#1");
  EXPECT_NE(r.tensors[1].encoding, "raw");  // the constant storage compressed
  const std::string dir = root.file("global_step1");
  EXPECT_TRUE(read_back(dir, a.name) == a.bytes());
  EXPECT_TRUE(read_back(dir, b.name) == b.bytes());
  FP_ASSERT_OK_AND_ASSIGN(auto report, verify_checkpoint(dir, *make_engine()));
  EXPECT_TRUE(report.ok());
}

TEST(SplitFile, AnyRangeReadsAsTheFileHasIt) {
  TempDir root;
  FakeFile a("a.pt", 1);
  auto manager = CheckpointManager::open(root.path(), options(Compression::kZstd, false));
  FP_ASSERT_OK(manager.status());
  commit_split(**manager, "t", {&a});
  FP_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::open(root.file("t"), make_engine()));
  FP_ASSERT_OK_AND_ASSIGN(SplitFileReader split, SplitFileReader::open(*reader, a.name));
  const std::vector<std::byte> want = a.bytes();
  ASSERT_EQ(split.size(), want.size());
  const uint64_t piece_a = a.header.size();  // where the first storage starts
  const uint64_t piece_b = piece_a + a.storage_a.size() + a.middle.size();
  const std::vector<std::pair<uint64_t, uint64_t>> ranges = {
      {0, 4},                                       // the zip magic a loader checks first
      {0, want.size()},                             // everything
      {piece_a, a.storage_a.size()},                // exactly one piece (a storage record)
      {piece_a - 5, 100},                           // other bytes, then part of a piece
      {piece_b - 7, a.storage_b.size() + 7},        // other bytes, then a whole piece
      {piece_a + 10, piece_b + 20 - piece_a - 10},  // part, other bytes, part
      {want.size() - 3, 3},                         // the end
      {want.size(), 0}};
  for (auto [offset, n] : ranges) {
    std::vector<std::byte> got(n);
    FP_ASSERT_OK(split.read_range(offset, got.data(), n, true));
    EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin() + static_cast<long>(offset)))
        << offset << "+" << n;
  }
  std::vector<std::byte> one(2);
  EXPECT_EQ(split.read_range(want.size() - 1, one.data(), 2, true).code(),
            StatusCode::kInvalidArgument);

  // Streamed back into a plain file (what convert writes): byte for byte, with its record.
  TempDir out;
  FP_ASSERT_OK_AND_ASSIGN(ManifestFile record, write_plain_file(split, out.path(), false, true, 2));
  FP_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> plain, read_whole_file(out.file(a.name)));
  EXPECT_TRUE(plain == want);
  EXPECT_EQ(record.name, a.name);
  EXPECT_EQ(record.role, "objects");
  EXPECT_EQ(record.size, want.size());
  EXPECT_EQ(record.checksum, xxh3_64(want.data(), want.size()));
  EXPECT_EQ(record.rank, 2u);
  std::vector<size_t> chunks;
  FP_ASSERT_OK(split.stream(4096, true, [&](const std::byte*, size_t n) {
    chunks.push_back(n);
    return Status::ok();
  }));
  EXPECT_LE(*std::max_element(chunks.begin(), chunks.end()), 4096u) << "bounded pieces";
}

TEST(SplitFile, IncrementalCommitsReferenceUnchangedPiecesOfTheBase) {
  TempDir root;
  FakeFile a("a.pt", 1);
  auto manager = CheckpointManager::open(root.path(), options(Compression::kNone, true));
  FP_ASSERT_OK(manager.status());
  EXPECT_EQ(commit_split(**manager, "s1", {&a}), "");  // the first is full: the base
  a.storage_b[5] = std::byte{1};                       // the smaller storage changes
  SplitWriteResult r;
  EXPECT_EQ(commit_split(**manager, "s2", {&a}, &r), "s1");
  EXPECT_TRUE(r.references_base);
  EXPECT_EQ(r.referenced_bytes, a.storage_a.size());
  EXPECT_EQ(r.tensors[0].file.rfind("s1/", 0), 0u) << r.tensors[0].file;
  EXPECT_EQ(r.tensors[1].file.rfind("s1/", 0), std::string::npos) << r.tensors[1].file;
  EXPECT_TRUE(read_back(root.file("s2"), a.name) == a.bytes());
  FP_ASSERT_OK_AND_ASSIGN(auto report, verify_checkpoint(root.file("s2"), *make_engine()));
  EXPECT_TRUE(report.ok());
  // The base is kept while a kept checkpoint references it.
  EXPECT_FALSE((*manager)->remove("s1").is_ok());
}

TEST(SplitFile, ACommitKeepsItsBaseFromRemovalUntilItEnds) {
  TempDir root;
  FakeFile a("a.pt", 1);
  auto manager = CheckpointManager::open(root.path(), options(Compression::kNone, true));
  FP_ASSERT_OK(manager.status());
  commit_split(**manager, "s1", {&a});
  FP_ASSERT_OK_AND_ASSIGN(auto commit, (*manager)->begin_commit("s2"));
  EXPECT_EQ(commit->base_tag(), "s1");
  Status refused = (*manager)->remove("s1");
  EXPECT_FALSE(refused.is_ok());
  EXPECT_NE(refused.message().find("base"), std::string::npos) << refused.to_string();
  FP_ASSERT_OK(commit->abort());
  FP_EXPECT_OK((*manager)->remove("s1"));
}

TEST(SplitFile, ThePlainFileIsNotASkeleton) {
  TempDir root;
  auto manager = CheckpointManager::open(root.path(), small_options());
  FP_ASSERT_OK(manager.status());
  FP_ASSERT_OK_AND_ASSIGN(auto commit, (*manager)->begin_commit("t"));
  FP_ASSERT_OK_AND_ASSIGN(ManifestFile f,
                          write_sidecar_file(commit->directory(), "x.pt", "PK plain", false, true));
  CommitContent c;
  c.files = {f};
  FP_ASSERT_OK(commit->commit(std::move(c)));
  FP_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::open(root.file("t"), make_engine()));
  auto split = SplitFileReader::open(*reader, "x.pt");
  EXPECT_EQ(split.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitFileReader::open(*reader, "nope.pt").status().code(), StatusCode::kNotFound);
}

TEST(SplitFile, ASkeletonWhosePieceIsNotInTheManifestIsRefused) {
  TempDir root;
  auto manager = CheckpointManager::open(root.path(), small_options());
  FP_ASSERT_OK(manager.status());
  FP_ASSERT_OK_AND_ASSIGN(auto commit, (*manager)->begin_commit("t"));
  std::string skeleton = encode_split_skeleton(10, {{2, 4}}, "abcdef");
  FP_ASSERT_OK_AND_ASSIGN(ManifestFile f,
                          write_sidecar_file(commit->directory(), "x.pt", skeleton, false, true));
  CommitContent c;
  c.files = {f};
  FP_ASSERT_OK(commit->commit(std::move(c)));
  FP_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::open(root.file("t"), make_engine()));
  auto split = SplitFileReader::open(*reader, "x.pt");
  EXPECT_EQ(split.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(split.status().message().find("x.pt#0"), std::string::npos)
      << split.status().to_string();
}

TEST(SplitSkeleton, RoundTripsAndRefusesEveryMalformedField) {
  std::string good = encode_split_skeleton(10, {{2, 3}, {5, 1}}, "abcdef");
  FP_ASSERT_OK_AND_ASSIGN(SplitSkeleton s, decode_split_skeleton(good, "f"));
  EXPECT_EQ(s.size, 10u);
  ASSERT_EQ(s.pieces.size(), 2u);
  EXPECT_EQ(s.pieces[1].offset, 5u);
  EXPECT_EQ(s.rest, "abcdef");
  auto refused = [](const std::string& bytes) {
    auto r = decode_split_skeleton(bytes, "f");
    return !r.is_ok() && r.status().code() == StatusCode::kDataLoss;
  };
  EXPECT_TRUE(refused(""));
  EXPECT_TRUE(refused("FPSPLIT1"));                       // header cut short
  EXPECT_TRUE(refused("PK\x03\x04 plain zip"));           // not a skeleton
  EXPECT_TRUE(refused(good.substr(0, good.size() - 1)));  // the other bytes do not add up
  EXPECT_TRUE(refused(encode_split_skeleton(10, {{5, 3}, {2, 1}}, "abcdef")));  // out of order
  EXPECT_TRUE(refused(encode_split_skeleton(10, {{2, 4}, {5, 1}}, "abcde")));   // overlapping
  EXPECT_TRUE(refused(encode_split_skeleton(10, {{8, 3}}, "abcdefg")));         // past the end
  EXPECT_TRUE(refused(encode_split_skeleton(10, {{2, 0}}, "abcdefghij")));      // empty piece
  EXPECT_TRUE(refused(encode_split_skeleton(20, {{10, UINT64_MAX}}, "")));      // wraps
  EXPECT_TRUE(refused(encode_split_skeleton(UINT64_MAX, {{0, 5}}, "")));        // a claimed size
  // A count far beyond what the bytes hold is refused before the table is allocated.
  std::string bomb = good;
  for (int i = 0; i < 8; ++i) bomb[16 + i] = static_cast<char>(0xff);
  EXPECT_TRUE(refused(bomb));
}

}  // namespace
}  // namespace fastpersist::testing
