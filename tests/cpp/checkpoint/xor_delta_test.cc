// SPDX-License-Identifier: Apache-2.0
// XOR deltas of incremental checkpoints (CheckpointOptions::xor_deltas, docs/incremental.md):
// a changed float tensor stored as the zstd-compressed XOR with its base's bytes. Bit-identical
// round trips for every float dtype, with each codec underneath and bases raw or compressed
// (at another chunk size too); full, selective, bounded and streamed loads; tensors that do not
// gain stay as they would be; the base kept by retention and remove() when only deltas use it;
// materialize; and damage in the delta or in its base reported, never loaded.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_test_util.h"
#include "checkpoint_dir/checkpoint_fs.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/tensor_codec.h"
#include "incremental/incremental.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace fastpersist::testing {
namespace {

// A standard normal value for (i, seed): Box-Muller over two splitmix64 uniforms.
double normal(uint64_t i, uint64_t seed) {
  auto mix = [](uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  const uint64_t a = mix(i * 2 + seed * 0x100000001b3ull),
                 b = mix(i * 2 + 1 + seed * 0x100000001b3ull);
  const double u = (static_cast<double>(a >> 11) + 1.0) / 9007199254740993.0;  // (0, 1]
  const double v = static_cast<double>(b >> 11) / 9007199254740992.0;
  return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
}

// Weights-like values (normal, scale 0.02: as incompressible as real weights): each version of
// element i moves from the last by a small step, as an optimizer step does.
double weight(size_t i, uint64_t seed, int version, double step = 2e-5) {
  double w = 0.02 * normal(i, seed);
  for (int k = 1; k <= version; ++k) w += step * normal(i, seed + 1000 + static_cast<uint64_t>(k));
  return w;
}

void fill_weights(OwnedTensor& t, uint64_t seed, int version, double step = 2e-5) {
  const size_t width = *safetensors_dtype_size(t.dtype);
  const size_t n = t.bytes.size() / width;
  for (size_t i = 0; i < n; ++i) {
    const double v = weight(i, seed, version, step);
    std::byte* at = t.bytes.data() + i * width;
    if (t.dtype == "F64") {
      std::memcpy(at, &v, 8);
    } else if (t.dtype == "F32") {
      float f = static_cast<float>(v);
      std::memcpy(at, &f, 4);
    } else if (t.dtype == "BF16") {
      float f = static_cast<float>(v);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      uint16_t top = static_cast<uint16_t>(bits >> 16);
      std::memcpy(at, &top, 2);
    } else if (t.dtype == "F16") {
      _Float16 h = static_cast<_Float16>(v);
      std::memcpy(at, &h, 2);
    }
  }
}

// Float tensors of every width (several chunks of the 64 KiB test window each), plus tensors
// that never change, and an integer one that changes (never a delta).
TestState model_state() {
  TestState s;
  s.add("w.f32", "F32", {300, 1000}, 1);
  s.add("w.bf16", "BF16", {250000}, 2);
  s.add("w.f16", "F16", {99999}, 3);
  s.add("w.f64", "F64", {50001}, 4);
  s.add("frozen.f32", "F32", {70000}, 5);
  s.add("counts.i64", "I64", {20000}, 6);
  s.add("small.f32", "F32", {100}, 7);
  for (OwnedTensor& t : s.tensors) {
    if (t.dtype != "I64") fill_weights(t, t.bytes.size(), 0);
  }
  s.objects = "objects";
  return s;
}

const std::vector<std::string> kDrifting = {"w.f32", "w.bf16", "w.f16", "w.f64"};

void drift(TestState* s, int version) {
  for (OwnedTensor& t : s->tensors) {
    for (const std::string& name : kDrifting) {
      if (t.name == name) fill_weights(t, t.bytes.size(), version);
    }
    if (t.name == "small.f32") fill_weights(t, 3, version);
    if (t.name == "counts.i64")
      t.bytes = random_bytes(t.bytes.size(), static_cast<uint64_t>(version) + 100);
  }
}

CheckpointOptions delta_options(Compression c) {
  CheckpointOptions o = small_options();
  o.incremental = true;
  o.xor_deltas = true;
  o.compression = c;
  o.compression_threads = 2;
  return o;
}

class XorDeltaTest : public ::testing::Test {
 protected:
  void open(const CheckpointOptions& o) {
    mgr_.reset();
    auto m = CheckpointManager::open(dir_, o);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    mgr_ = std::move(m).value();
  }
  std::string save(const std::string& tag, const TestState& s) {
    return save_and_wait(*mgr_, tag, s);
  }
  Manifest manifest(const std::string& tag) {
    auto m = read_manifest(file(tag));
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    return m.is_ok() ? std::move(m).value() : Manifest{};
  }
  static const ManifestTensor& tensor(const Manifest& m, const std::string& name) {
    return m.tensors[m.find_tensor(name).value()];
  }
  std::unique_ptr<CheckpointReader> reader(const std::string& tag) {
    auto r = CheckpointReader::open(file(tag), engine_);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? std::move(r).value() : nullptr;
  }
  // Every tensor loads bit-identical: whole, bounded (64 KiB: every delta streamed in pieces),
  // and one by one into the caller's memory.
  void expect_loads(const std::string& tag, const TestState& s) {
    auto r = reader(tag);
    ASSERT_NE(r, nullptr);
    for (uint64_t max_memory : {uint64_t{0}, uint64_t{64 * kKiB}}) {
      LoadRequest req;
      req.max_memory = max_memory;
      FP_ASSERT_OK_AND_ASSIGN(LoadResult loaded, r->load(req));
      for (const OwnedTensor& t : s.tensors) {
        long k = loaded.loaded_index.at(r->manifest().find_tensor(t.name).value());
        ASSERT_GE(k, 0);
        const LoadedTensor& lt = loaded.tensors[static_cast<size_t>(k)];
        std::span<const std::byte> got;
        if (lt.buffer != nullptr)
          got = {lt.buffer->data() + lt.offset, static_cast<size_t>(lt.nbytes)};
        EXPECT_EQ("", first_difference(t.bytes, got))
            << tag << " " << t.name << " max_memory " << max_memory;
      }
    }
    for (const std::string& name : kDrifting) {
      if (s.find(name) == nullptr) continue;
      const OwnedTensor& t = *s.find(name);
      std::vector<std::byte> memory(t.bytes.size());
      LoadRequest req;
      req.names = std::vector<std::string>{name};
      req.destinations.push_back({name, memory.data(), memory.size(), t.dtype, t.shape, {}});
      FP_ASSERT_OK(r->load(req).status());
      EXPECT_EQ(memory, t.bytes) << tag << " " << name << " into memory";
      std::vector<std::byte> pieces;
      FP_ASSERT_OK(r->read_pieces(r->manifest().find_tensor(name).value(), 8192, true,
                                  [&](uint64_t offset, const std::byte* data, size_t size) {
                                    EXPECT_EQ(offset, pieces.size());
                                    pieces.insert(pieces.end(), data, data + size);
                                    return Status::ok();
                                  }));
      EXPECT_EQ(pieces, t.bytes) << tag << " " << name << " in pieces";
    }
  }

  std::string file(const std::string& name) const { return dir_ + "/" + name; }
  uint64_t own_stored(const std::string& tag) {
    return checkpoint::own_stored_bytes(manifest(tag));
  }

  TempDir root_;
  std::string dir_ = root_.path();  // the checkpoint root in use
  std::shared_ptr<IoEngine> engine_ = make_engine();
  std::unique_ptr<CheckpointManager> mgr_;
};

TEST_F(XorDeltaTest, DriftingFloatsAreStoredAsSmallDeltasAndLoadBitIdenticalWithEveryCodec) {
  for (Compression c : {Compression::kNone, Compression::kZstd, Compression::kLz4}) {
    const std::string codec(compression_name(c));
    SCOPED_TRACE(codec);
    dir_ = root_.path() + "/" + codec;
    open(delta_options(c));
    TestState s = model_state();
    const std::string base = codec + "-1";
    EXPECT_EQ(save(base, s), "");
    const TestState first = s;
    drift(&s, 1);
    EXPECT_EQ(save(codec + "-2", s), base);
    const TestState second = s;
    // The third save takes deltas against the base again, unless the second came out larger
    // than half of it (the rule IncrementalDeltasLargerThanHalfTheBaseMakeTheNextSaveFull pins).
    const bool aged = 2 * own_stored(codec + "-2") > own_stored(base);
    drift(&s, 2);
    EXPECT_EQ(save(codec + "-3", s), aged ? "" : base);
    ASSERT_TRUE(mgr_->close().is_ok());

    const Manifest b = manifest(base);
    std::vector<std::string> deltas = {codec + "-2"};
    if (!aged) deltas.push_back(codec + "-3");
    for (const std::string& tag : deltas) {
      const Manifest m = manifest(tag);
      for (const std::string& name : kDrifting) {
        const ManifestTensor& t = tensor(m, name);
        const ManifestTensor& was = tensor(b, name);
        EXPECT_EQ(t.encoding, kEncodingXorZstd) << tag << " " << name;
        ASSERT_TRUE(t.delta_base.has_value()) << name;
        EXPECT_EQ(t.delta_base->file, base + "/" + was.file);
        EXPECT_EQ(t.delta_base->offset, was.offset);
        EXPECT_EQ(t.delta_base->stored_length, was.stored_length);
        EXPECT_EQ(t.delta_base->encoding, was.encoding);
        EXPECT_EQ(t.delta_base->checksum, was.checksum);
        // Smaller than the tensor was stored alone (raw or compressed): the high bytes of each
        // element did not move. (F64 gains least: a step changes most of its 52 mantissa bits.)
        EXPECT_LT(t.stored_length, was.stored_length) << tag << " " << name;
        if (name == "w.bf16" || name == "w.f32") {
          EXPECT_LT(t.stored_length * 10, was.stored_length * 7) << name;
        }
        EXPECT_NE(m.find_file(t.delta_base->file), nullptr);
      }
      EXPECT_EQ(tensor(m, "frozen.f32").file.rfind(base + "/", 0), 0u) << "unchanged: a reference";
      EXPECT_FALSE(tensor(m, "counts.i64").delta_base.has_value())
          << "integers: written as they are";
      EXPECT_FALSE(tensor(m, "small.f32").delta_base.has_value()) << "under 64 KiB: written raw";
    }
    expect_loads(base, first);
    expect_loads(codec + "-3", s);
    expect_loads(codec + "-2", second);
    expect_verifies(file(codec + "-2"));
    expect_verifies(file(codec + "-3"));
    FP_ASSERT_OK_AND_ASSIGN(auto infos, list_checkpoints(dir_));
    ASSERT_EQ(infos.size(), 3u);
    EXPECT_EQ(infos[1].references, (std::vector<std::string>{base}));
  }
}

TEST_F(XorDeltaTest, IncrementalDeltasLargerThanHalfTheBaseMakeTheNextSaveFull) {
  open(delta_options(Compression::kNone));
  TestState s;
  s.add("w", "F32", {200000}, 1);
  fill_weights(s.tensors[0], 5, 0);
  EXPECT_EQ(save("s1", s), "");
  // Tiny steps: only the lowest mantissa bits move; the delta is a fraction of the base.
  fill_weights(s.tensors[0], 5, 1, 1e-8);
  EXPECT_EQ(save("s2", s), "s1");
  EXPECT_LT(2 * own_stored("s2"), own_stored("s1"));
  // Large steps (10% of a weight): still a delta (smaller than raw), but more than half the
  // base: the base has aged, so the save after it is full.
  fill_weights(s.tensors[0], 5, 1, 2e-3);
  EXPECT_EQ(save("s3", s), "s1");
  EXPECT_EQ(manifest("s3").tensors[0].encoding, kEncodingXorZstd);
  EXPECT_GT(2 * own_stored("s3"), own_stored("s1"));
  fill_weights(s.tensors[0], 5, 2, 2e-3);
  EXPECT_EQ(save("s4", s), "") << "a fresh base";
  fill_weights(s.tensors[0], 5, 3, 2e-3);
  EXPECT_EQ(save("s5", s), "s4");
  ASSERT_TRUE(mgr_->close().is_ok());
  expect_loads("s5", s);
}

TEST_F(XorDeltaTest, ABaseWrittenWithAnotherChunkSizeAndTensorsThatDoNotGain) {
  CheckpointOptions o = delta_options(Compression::kZstd);
  open(o);
  TestState s = model_state();
  save("s1", s);
  // A reopened manager with wider windows: its chunks (128 KiB) straddle the base's (64 KiB).
  o.staging_window_bytes = 128 * kKiB;
  open(o);
  drift(&s, 1);
  // New random bytes in one float tensor: its XOR with the base is no smaller than itself.
  for (OwnedTensor& t : s.tensors) {
    if (t.name == "w.f64") t.bytes = random_bytes(t.bytes.size(), 77);
  }
  EXPECT_EQ(save("s2", s), "s1");
  ASSERT_TRUE(mgr_->close().is_ok());
  const Manifest m = manifest("s2");
  EXPECT_EQ(tensor(m, "w.f32").encoding, kEncodingXorZstd);
  EXPECT_EQ(tensor(m, "w.f64").encoding, "raw") << "random bytes: stored as without a base";
  EXPECT_FALSE(tensor(m, "w.f64").delta_base.has_value());
  expect_loads("s2", s);
  expect_verifies(file("s2"));
}

TEST_F(XorDeltaTest, ABaseOnlyDeltasUseIsKeptByRetentionAndRemoveAndMaterializeFreesIt) {
  CheckpointOptions o = delta_options(Compression::kNone);
  o.keep_last = 1;
  open(o);
  TestState s;
  s.add("w.f32", "F32", {100000}, 1);
  s.add("w.bf16", "BF16", {100000}, 2);
  for (OwnedTensor& t : s.tensors) fill_weights(t, 9, 0);
  save("s1", s);
  for (OwnedTensor& t : s.tensors) fill_weights(t, 9, 1);
  EXPECT_EQ(save("s2", s), "s1");
  const Manifest m = manifest("s2");
  for (const ManifestTensor& t : m.tensors) {
    EXPECT_EQ(t.encoding, kEncodingXorZstd) << t.name;
    EXPECT_EQ(referenced_checkpoint(*m.find_file(t.file)), "")
        << "every tensor is in s2's own file";
  }
  // Only the deltas need s1, and that is enough to keep it.
  EXPECT_EQ(listed_tags(dir_), (std::vector<std::string>{"s1", "s2"}));
  Status refused = mgr_->remove("s1");
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.to_string();
  FP_ASSERT_OK(mgr_->materialize("s2").status());
  const Manifest standalone = manifest("s2");
  for (const ManifestTensor& t : standalone.tensors) {
    ASSERT_TRUE(t.delta_base.has_value());
    EXPECT_EQ(referenced_checkpoint(*standalone.find_file(t.delta_base->file)), "")
        << t.delta_base->file;
  }
  FP_ASSERT_OK(mgr_->remove("s1"));
  ASSERT_TRUE(mgr_->close().is_ok());
  expect_loads("s2", s);
}

TEST_F(XorDeltaTest, ABaseTensorThatCannotBeDecodedIsSavedWithoutADelta) {
  open(delta_options(Compression::kZstd));
  TestState s = model_state();
  save("s1", s);
  const ManifestTensor broken = tensor(manifest("s1"), "w.bf16");
  ASSERT_EQ(broken.encoding, "zstd");
  flip_byte(file("s1") + "/" + broken.file, broken.offset + 40);  // inside its first frame
  drift(&s, 1);
  EXPECT_EQ(save("s2", s), "s1") << "the save goes on";
  ASSERT_TRUE(mgr_->close().is_ok());
  const Manifest m = manifest("s2");
  EXPECT_EQ(tensor(m, "w.bf16").encoding, "zstd")
      << "its base is unreadable: stored as without one";
  EXPECT_FALSE(tensor(m, "w.bf16").delta_base.has_value());
  EXPECT_EQ(tensor(m, "w.f32").encoding, kEncodingXorZstd);
  expect_loads("s2", s);
  expect_verifies(file("s2"));
}

TEST_F(XorDeltaTest, DamageInADeltaOrInItsBaseIsReportedNeverLoaded) {
  open(delta_options(Compression::kLz4));
  TestState s = model_state();
  save("s1", s);
  drift(&s, 1);
  save("s2", s);
  ASSERT_TRUE(mgr_->close().is_ok());
  const Manifest m = manifest("s2");
  const ManifestTensor& t = tensor(m, "w.bf16");
  ASSERT_EQ(t.encoding, kEncodingXorZstd);
  auto expect_refused = [&](const std::string& what) {
    FP_ASSERT_OK_AND_ASSIGN(VerifyReport report, verify_checkpoint(file("s2"), *engine_));
    EXPECT_TRUE(any_contains(report.problems, "w.bf16")) << what << ": " << joined(report.problems);
    for (uint64_t max_memory : {uint64_t{0}, uint64_t{64 * kKiB}}) {
      auto r = reader("s2");
      ASSERT_NE(r, nullptr);
      LoadRequest req;
      req.max_memory = max_memory;
      auto loaded = r->load(req);
      ASSERT_FALSE(loaded.is_ok()) << what;
      EXPECT_EQ(loaded.status().code(), StatusCode::kDataLoss) << what;
      EXPECT_NE(loaded.status().message().find("w.bf16"), std::string::npos)
          << loaded.status().to_string();
    }
  };
  const std::string own = file("s2") + "/" + t.file;
  flip_byte(own, t.offset + 40);  // inside the first delta frame
  expect_refused("a damaged delta frame");
  flip_byte(own, t.offset + 40);
  // A byte of the base's bytes (a raw base here: lz4 leaves weights raw, or frames them).
  const std::string base_path = dir_ + "/" + t.delta_base->file;
  flip_byte(base_path, t.delta_base->offset + t.delta_base->stored_length / 2);
  expect_refused("a damaged base");
  flip_byte(base_path, t.delta_base->offset + t.delta_base->stored_length / 2);
  expect_verifies(file("s2"));
  // The base removed behind the manager's back: the delta cannot be read at all.
  FP_ASSERT_OK(checkpoint::remove_tree(file("s1")));
  EXPECT_FALSE(CheckpointReader::open(file("s2"), engine_).is_ok());
}

}  // namespace
}  // namespace fastpersist::testing
