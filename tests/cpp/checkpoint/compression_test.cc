// SPDX-License-Identifier: Apache-2.0
// Compressed checkpoints end to end (CheckpointOptions::compression): saved through the manager
// with each codec, loaded bit-identical whole, selectively, bounded, into destinations and
// converted; data files that are valid safetensors; compressible tensors stored compressed and
// the others raw; verify decoding; damaged frames and tables reported, never loaded.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_test_util.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/dtype.h"
#include "fastpersist/shard_writer.h"
#include "fastpersist/tensor_codec.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace fastpersist::testing {
namespace {

// Values of a narrow range in each element width, so that grouping and the codec find the
// repeated high bytes, as in real weights.
std::vector<std::byte> smooth_bytes(size_t bytes, size_t width, uint64_t seed) {
  std::vector<std::byte> out = random_bytes(bytes, seed);
  for (size_t i = width - 1; i < bytes; i += width) out[i] = std::byte{0x3c};  // high byte
  if (width >= 4) {
    for (size_t i = width - 2; i < bytes; i += width) out[i] &= std::byte{0x0f};
  }
  return out;
}

TestState compressible_state() {
  TestState s;
  auto smooth = [&](const std::string& name, const std::string& dtype, std::vector<uint64_t> shape,
                    uint64_t seed) {
    OwnedTensor& t = s.add(name, dtype, std::move(shape), seed);
    t.bytes = smooth_bytes(t.bytes.size(), *safetensors_dtype_size(dtype), seed);
  };
  smooth("w.f32", "F32", {300, 1000}, 1);  // 1.2 MB: many 64 KiB chunks
  smooth("w.bf16", "BF16", {250001}, 2);   // odd length: a short last chunk
  smooth("w.f16", "F16", {70000}, 3);
  smooth("w.f64", "F64", {20000}, 4);
  smooth("w.i64", "I64", {30000}, 5);
  s.add("noise.f32", "F32", {80000}, 6);  // random: stored raw
  s.add("small.f32", "F32", {100}, 7);    // under 64 KiB: stored raw
  OwnedTensor& mask = s.add("mask", "BOOL", {200000}, 8);
  for (size_t i = 0; i < mask.bytes.size(); ++i) mask.bytes[i] = std::byte(i % 7 == 0);
  s.add("empty", "F32", {0}, 9);
  s.add("scalar", "I64", {}, 10);
  s.aliases = {{"tied", "w.f32"}};
  s.objects = std::string(5000, 'o');
  s.step = 9;
  return s;
}

CheckpointOptions compressed_options(Compression c, std::optional<int> level = std::nullopt) {
  CheckpointOptions o = small_options();
  o.compression = c;
  o.compression_level = level;
  o.compression_threads = 2;
  return o;
}

class CompressionTest : public ::testing::Test {
 protected:
  std::string save(const TestState& state, const CheckpointOptions& options,
                   const std::string& tag = "a") {
    auto mgr = CheckpointManager::open(root_.path(), options);
    EXPECT_TRUE(mgr.is_ok()) << mgr.status().to_string();
    if (!mgr.is_ok()) return "";
    Status st = (*mgr)->save(tag, state.content());
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_TRUE((*mgr)->close().is_ok());
    return root_.file(tag);
  }
  std::unique_ptr<CheckpointReader> open(const std::string& dir) {
    auto r = CheckpointReader::open(dir, engine_);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? std::move(r).value() : nullptr;
  }
  static std::span<const std::byte> bytes_of(const CheckpointReader& reader, const LoadResult& r,
                                             const std::string& name) {
    size_t i = reader.manifest().find_tensor(name).value();
    long k = r.loaded_index.at(i);
    if (k < 0) return {};
    const LoadedTensor& t = r.tensors[static_cast<size_t>(k)];
    if (t.buffer == nullptr) return {};
    return {t.buffer->data() + t.offset, static_cast<size_t>(t.nbytes)};
  }
  void expect_loads(const std::string& dir, const TestState& state, uint64_t max_memory = 0) {
    auto reader = open(dir);
    ASSERT_NE(reader, nullptr);
    LoadRequest req;
    req.max_memory = max_memory;
    FP_ASSERT_OK_AND_ASSIGN(LoadResult r, reader->load(req));
    ASSERT_EQ(r.tensors.size(), state.tensors.size());
    for (const OwnedTensor& t : state.tensors) {
      EXPECT_EQ("", first_difference(t.bytes, bytes_of(*reader, r, t.name))) << t.name;
    }
  }
  const ManifestTensor& tensor(const Manifest& m, const std::string& name) {
    return m.tensors[m.find_tensor(name).value()];
  }

  TempDir root_;
  std::shared_ptr<IoEngine> engine_ = make_engine();
};

TEST_F(CompressionTest, EachCodecRoundTripsBitIdenticalAndStoresOnlyWhatShrinks) {
  const TestState state = compressible_state();
  for (auto [c, level] :
       std::vector<std::pair<Compression, std::optional<int>>>{{Compression::kZstd, std::nullopt},
                                                               {Compression::kZstd, 5},
                                                               {Compression::kLz4, std::nullopt},
                                                               {Compression::kLz4, 9}}) {
    SCOPED_TRACE(std::string(compression_name(c)) + " level " +
                 std::to_string(level.value_or(-100)));
    const std::string tag = std::string(compression_name(c)) + std::to_string(level.value_or(0));
    const std::string dir = save(state, compressed_options(c, level), tag);
    expect_loads(dir, state);
    expect_verifies(dir);
    FP_ASSERT_OK_AND_ASSIGN(Manifest m, read_manifest(dir));
    const std::string codec(compression_name(c));
    for (const char* name : {"w.f32", "w.bf16", "w.f16", "w.f64", "w.i64", "mask"}) {
      const ManifestTensor& t = tensor(m, name);
      EXPECT_EQ(t.encoding, codec) << name;
      EXPECT_LT(t.stored_length, t.length) << name;
    }
    for (const char* name : {"noise.f32", "small.f32", "empty", "scalar"}) {
      const ManifestTensor& t = tensor(m, name);
      EXPECT_EQ(t.encoding, "raw") << name;
      EXPECT_EQ(t.stored_length, t.length) << name;
    }
    // Every data file is a valid safetensors file: compressed tensors as U8 bytes.
    for (const ManifestFile& f : m.files) {
      if (f.role != "tensors") continue;
      FP_ASSERT_OK_AND_ASSIGN(SafetensorsHeader h, read_safetensors_header(dir + "/" + f.name));
      EXPECT_EQ(h.metadata.at("fastpersist.encoding"), codec);
      EXPECT_EQ(h.file_bytes(), f.size);
      EXPECT_EQ(h.data_start % 4096, 0u);
      for (const SafetensorsTensor& e : h.tensors) {
        const ManifestTensor& t = tensor(m, e.name);
        EXPECT_EQ(h.data_start + e.begin, t.offset) << e.name;
        EXPECT_EQ(e.nbytes(), t.stored_length) << e.name;
        EXPECT_EQ(e.dtype, t.encoding == "raw" ? t.dtype : "U8") << e.name;
      }
    }
  }
}

TEST_F(CompressionTest, SelectiveBoundedConvertedAndInPlaceLoads) {
  const TestState state = compressible_state();
  const std::string dir = save(state, compressed_options(Compression::kZstd));
  // Bounded below one tensor: the large compressed tensors stream chunk by chunk.
  expect_loads(dir, state, 256 * kKiB);
  auto reader = open(dir);
  ASSERT_NE(reader, nullptr);
  {
    LoadRequest req;
    req.names = std::vector<std::string>{"tied", "w.bf16"};
    FP_ASSERT_OK_AND_ASSIGN(LoadResult r, reader->load(req));
    EXPECT_EQ(r.tensors.size(), 2u);
    EXPECT_EQ("", first_difference(state.find("w.f32")->bytes, bytes_of(*reader, r, "w.f32")));
    EXPECT_EQ("", first_difference(state.find("w.bf16")->bytes, bytes_of(*reader, r, "w.bf16")));
  }
  {  // Into memory of the stored dtype (decoded straight into it), and converted to F64.
    const OwnedTensor& f32 = *state.find("w.f32");
    std::vector<std::byte> same(f32.bytes.size());
    std::vector<std::byte> wide(f32.bytes.size() * 2);
    LoadRequest req;
    req.names = std::vector<std::string>{"w.f32", "w.i64"};
    req.destinations.push_back({"w.f32", same.data(), same.size(), "F32", f32.shape, {}});
    const OwnedTensor& i64 = *state.find("w.i64");
    std::vector<std::byte> as_f64(i64.bytes.size());
    req.destinations.push_back({"w.i64", as_f64.data(), as_f64.size(), "F64", i64.shape, {}});
    FP_ASSERT_OK_AND_ASSIGN(LoadResult r, reader->load(req));
    EXPECT_EQ(same, f32.bytes);
    std::vector<std::byte> expected(as_f64.size());
    FP_ASSERT_OK(
        convert_elements("I64", i64.bytes.data(), "F64", expected.data(), i64.bytes.size() / 8));
    EXPECT_EQ(as_f64, expected);
    (void)wide;
  }
  {  // A whole bounded streamed tensor into a destination.
    const OwnedTensor& bf16 = *state.find("w.bf16");
    std::vector<std::byte> memory(bf16.bytes.size());
    LoadRequest req;
    req.names = std::vector<std::string>{"w.bf16"};
    req.max_memory = 64 * kKiB;
    req.destinations.push_back({"w.bf16", memory.data(), memory.size(), "BF16", bf16.shape, {}});
    FP_ASSERT_OK(reader->load(req).status());
    EXPECT_EQ(memory, bf16.bytes);
  }
  {  // read_pieces decodes too, in pieces no larger than asked.
    size_t k = reader->manifest().find_tensor("w.f32").value();
    std::vector<std::byte> got;
    FP_ASSERT_OK(reader->read_pieces(k, 8192, true,
                                     [&](uint64_t offset, const std::byte* data, size_t size) {
                                       EXPECT_EQ(offset, got.size());
                                       EXPECT_LE(size, 8192u);
                                       got.insert(got.end(), data, data + size);
                                       return Status::ok();
                                     }));
    EXPECT_EQ(got, state.find("w.f32")->bytes);
    // read() hands out stored bytes of raw tensors only.
    auto refused = reader->read({{k, nullptr, 0}}, true);
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find("load() decodes it"), std::string::npos);
  }
}

TEST_F(CompressionTest, DefaultWindowsMakeFourMiBChunksAndBudgetsStream) {
  TestState state;
  OwnedTensor& big = state.add("big", "BF16", {5 * (1 << 20) + 3}, 1);  // 10 MiB + 6: 3 chunks
  big.bytes = smooth_bytes(big.bytes.size(), 2, 1);
  CheckpointOptions o;
  o.durable = false;
  o.lock_staging_memory = false;
  o.compression = Compression::kLz4;
  std::string dir = save(state, o, "default");
  expect_loads(dir, state);
  FP_ASSERT_OK_AND_ASSIGN(Manifest m, read_manifest(dir));
  EXPECT_EQ(m.tensors[0].encoding, "lz4");
  // A staging budget of two small windows: the snapshot streams through compression.
  o.staging_budget_bytes = 2 * 256 * kKiB;
  o.staging_window_bytes = 256 * kKiB;
  o.compression = Compression::kZstd;
  dir = save(state, o, "budget");
  expect_loads(dir, state);
  expect_verifies(dir);
}

TEST_F(CompressionTest, PlannedSizeBoundsTheFilesWithSmallChunksToo) {
  // A tensor that shrinks in its first chunk (so it is stored compressed) and then does not:
  // its frames take the most, and small windows make many small chunks, each with its frame
  // overhead and table entry. The plan's bound must still cover every file.
  TestState state;
  OwnedTensor& t = state.add("mixed", "F32", {600000}, 1);  // 2.4 MB
  const std::vector<std::byte> smooth = smooth_bytes(64 * kKiB, 4, 2);
  std::copy(smooth.begin(), smooth.end(), t.bytes.begin());
  state.add("noise", "F32", {100000}, 3);
  for (size_t window : {size_t{4096}, 16 * kKiB, 64 * kKiB}) {
    for (Compression c : {Compression::kZstd, Compression::kLz4}) {
      ShardWriterOptions o;
      o.staging_window_bytes = window;
      o.lock_staging_memory = false;
      o.durable = false;
      o.compression = c;
      FP_ASSERT_OK_AND_ASSIGN(auto writer, ShardWriter::create(o, engine_));
      const CheckpointContent content = state.content();
      FP_ASSERT_OK_AND_ASSIGN(ShardPlan plan, writer->plan(content.tensors));
      const std::string dir = root_.file(std::string(compression_name(c)) + std::to_string(window));
      ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
      FP_ASSERT_OK_AND_ASSIGN(ShardWriteResult r, writer->write(dir, content.tensors, plan));
      EXPECT_EQ(r.tensors[0].encoding, compression_name(c)) << window;
      EXPECT_LE(r.bytes_written, plan.total_bytes()) << compression_name(c) << " window " << window;
    }
  }
}

TEST_F(CompressionTest, DamagedFramesAndTablesAreReportedAndNeverLoaded) {
  const TestState state = compressible_state();
  const std::string dir = save(state, compressed_options(Compression::kZstd));
  FP_ASSERT_OK_AND_ASSIGN(Manifest m, read_manifest(dir));
  const ManifestTensor& t = tensor(m, "w.f32");
  const std::string path = dir + "/" + t.file;
  for (uint64_t at :
       {t.offset + 100, t.offset + t.stored_length / 2, t.offset + t.stored_length - 3}) {
    SCOPED_TRACE("byte " + std::to_string(at - t.offset) + " of " +
                 std::to_string(t.stored_length));
    flip_byte(path, at);
    for (bool verify : {true, false}) {
      auto reader = open(dir);
      ASSERT_NE(reader, nullptr);
      LoadRequest req;
      req.verify = verify;
      auto r = reader->load(req);
      ASSERT_FALSE(r.is_ok());
      EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().to_string();
      EXPECT_NE(r.status().message().find("tensor 'w.f32'"), std::string::npos)
          << r.status().to_string();
      req.max_memory = 64 * kKiB;  // the streamed route
      r = reader->load(req);
      ASSERT_FALSE(r.is_ok());
      EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().to_string();
    }
    FP_ASSERT_OK_AND_ASSIGN(VerifyReport report, verify_checkpoint(dir, *engine_));
    EXPECT_TRUE(any_contains(report.problems, "tensor 'w.f32'")) << joined(report.problems);
    flip_byte(path, at);  // repaired
  }
  expect_loads(dir, state);
  expect_verifies(dir);
}

// Saved without checksums, a damaged frame is still found by verify (the frames' own content
// checksums), as load() finds it, and an intact checkpoint still verifies.
TEST_F(CompressionTest, VerifyDecodesFramesEvenWithoutChecksums) {
  const TestState state = compressible_state();
  CheckpointOptions o = compressed_options(Compression::kZstd);
  o.checksums = false;
  const std::string dir = save(state, o);
  FP_ASSERT_OK_AND_ASSIGN(VerifyReport intact, verify_checkpoint(dir, *engine_));
  EXPECT_TRUE(intact.ok()) << joined(intact.problems);
  EXPECT_FALSE(intact.has_checksums);
  FP_ASSERT_OK_AND_ASSIGN(Manifest m, read_manifest(dir));
  const ManifestTensor& t = tensor(m, "w.f32");
  ASSERT_NE(t.encoding, "raw");
  flip_byte(dir + "/" + t.file, t.offset + t.stored_length / 2);
  auto reader = open(dir);
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(reader->load(LoadRequest{}).status().code(), StatusCode::kDataLoss);
  FP_ASSERT_OK_AND_ASSIGN(VerifyReport report, verify_checkpoint(dir, *engine_));
  EXPECT_TRUE(any_contains(report.problems, "w.f32")) << joined(report.problems);
}

TEST_F(CompressionTest, BadOptionsAreRefused) {
  CheckpointOptions o = compressed_options(Compression::kZstd, 1000);
  auto mgr = CheckpointManager::open(root_.path(), o);
  ASSERT_FALSE(mgr.is_ok());
  EXPECT_EQ(mgr.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(mgr.status().message().find("zstd compression level"), std::string::npos)
      << mgr.status().to_string();
}

}  // namespace
}  // namespace fastpersist::testing
