// SPDX-License-Identifier: Apache-2.0
// tests/data/checkpoint-v1/: a real root written by fastpersist 0.1.0 (manifest format 1, see
// tests/data/make_checkpoint_v1.py). Every later fastpersist must keep listing, reading and
// verifying it, value for value; the expected values are recomputed here from the generator's
// formulas. The fixture is only read: nothing here opens a manager on it (that takes a lock).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "checkpoint/checkpoint_test_util.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/manifest.h"
#include "testing/status_matchers.h"

namespace fastpersist::testing {
namespace {

std::string fixture_root() { return std::string(FASTPERSIST_TEST_DATA_DIR) + "/checkpoint-v1"; }

template <typename T>
std::vector<std::byte> bytes_of(const std::vector<T>& values) {
  std::vector<std::byte> out(values.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// IEEE half of a value that half represents exactly (the fixture's values all are).
uint16_t half_bits(double v) {
  if (v == 0) return std::signbit(v) ? 0x8000 : 0;
  uint16_t sign = v < 0 ? 0x8000 : 0;
  int exponent = 0;
  double mantissa = std::frexp(std::fabs(v), &exponent);  // [0.5, 1) * 2^exponent
  return static_cast<uint16_t>(sign | ((exponent - 1 + 15) << 10) |
                               static_cast<uint16_t>(std::ldexp(mantissa * 2 - 1, 10)));
}

uint16_t bf16_bits(float v) {
  uint32_t bits = 0;
  std::memcpy(&bits, &v, 4);
  return static_cast<uint16_t>(bits >> 16);  // exact values: truncation is the rounding
}

// model_state(step) of make_checkpoint_v1.py, as dtype, shape and little-endian bytes.
std::map<std::string, OwnedTensor> expected_model(int step) {
  std::map<std::string, OwnedTensor> out;
  auto put = [&](const std::string& name, const std::string& dtype, std::vector<uint64_t> shape,
                 std::vector<std::byte> bytes) {
    out["model." + name] = {"model." + name, dtype, std::move(shape), std::move(bytes)};
  };
  std::vector<float> embed;
  for (int i = 0; i < 48; ++i)
    embed.push_back(static_cast<float>(i) / 8 + static_cast<float>(step));
  put("embed.weight", "F32", {12, 4}, bytes_of(embed));
  std::vector<uint16_t> weight;
  for (int i = 0; i < 24; ++i)
    weight.push_back(bf16_bits(static_cast<float>(i) / 4 - 3 + static_cast<float>(step)));
  put("layer0.weight", "BF16", {4, 6}, bytes_of(weight));
  std::vector<uint16_t> bias;
  for (int i = 0; i < 6; ++i) bias.push_back(half_bits(i / 2.0 - step));
  put("layer0.bias", "F16", {6}, bytes_of(bias));
  std::vector<int64_t> positions;
  for (int64_t i = 0; i < 10; ++i) positions.push_back(i * step - 7);
  put("position_ids", "I64", {10}, bytes_of(positions));
  std::vector<uint8_t> mask, token_bytes;
  for (int i = 0; i < 8; ++i) mask.push_back(i % 3 == 0 ? 1 : 0);
  put("mask", "BOOL", {8}, bytes_of(mask));
  for (int i = 0; i < 16; ++i) token_bytes.push_back(static_cast<uint8_t>(i * 7 + step));
  put("token_bytes", "U8", {16}, bytes_of(token_bytes));
  put("scale", "F64", {}, bytes_of(std::vector<double>{2.5 * step}));
  put("empty", "F32", {0, 3}, {});
  return out;
}

class V1FixtureTest : public ::testing::TestWithParam<int> {
 protected:
  std::string dir() const { return fixture_root() + "/step-000000" + std::to_string(GetParam()); }
};

TEST(V1Fixture, RootListsBothCheckpointsAndLatest) {
  std::vector<std::string> skipped;
  FP_ASSERT_OK_AND_ASSIGN(auto listed, list_checkpoints(fixture_root(), &skipped));
  EXPECT_TRUE(skipped.empty()) << joined(skipped);
  ASSERT_EQ(tags_of(listed), (std::vector<std::string>{"step-00000010", "step-00000020"}));
  EXPECT_EQ(listed[0].step, 10);
  EXPECT_EQ(listed[1].step, 20);
  EXPECT_LT(listed[0].sequence, listed[1].sequence);
  EXPECT_EQ(listed[1].num_tensors, 8u);  // nine names, one an alias
  FP_ASSERT_OK_AND_ASSIGN(auto latest, latest_checkpoint(fixture_root()));
  EXPECT_EQ(latest, "step-00000020");
  EXPECT_EQ(read_text(fixture_root() + "/latest").substr(0, 13), "step-00000020");
}

TEST_P(V1FixtureTest, ManifestIsFormatOneWithTheV2FieldsAtTheirV1Meaning) {
  FP_ASSERT_OK_AND_ASSIGN(Manifest m, read_manifest(dir()));
  EXPECT_EQ(m.format_version, 1);
  EXPECT_EQ(m.tag, "step-000000" + std::to_string(GetParam()));
  EXPECT_EQ(m.step, GetParam());
  EXPECT_EQ(m.world_size, 1u);
  EXPECT_EQ(m.versions.at("fastpersist"), "0.1.0");
  EXPECT_NE(m.metadata_json.find(R"("run":"fixture-v1")"), std::string::npos) << m.metadata_json;
  EXPECT_NE(m.metadata_json.find(R"("tags":["a","b"])"), std::string::npos) << m.metadata_json;
  for (const ManifestFile& f : m.files) EXPECT_EQ(f.rank, std::nullopt) << f.name;
  for (const ManifestTensor& t : m.tensors) {
    EXPECT_EQ(t.encoding, "raw") << t.name;
    EXPECT_EQ(t.stored_length, t.length) << t.name;
  }
  // Tied weights: one stored, the other an alias of it.
  ASSERT_EQ(m.aliases.size(), 1u);
  std::string tied = m.aliases.begin()->first + " " + m.aliases.begin()->second;
  EXPECT_TRUE(tied == "model.lm_head.weight model.embed.weight" ||
              tied == "model.embed.weight model.lm_head.weight")
      << tied;
}

TEST_P(V1FixtureTest, EveryTensorReadsBackToItsValue) {
  auto engine = make_engine();
  ASSERT_NE(engine, nullptr);
  FP_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::open(dir(), engine));
  const Manifest& m = reader->manifest();
  std::map<std::string, OwnedTensor> want = expected_model(GetParam());
  want.erase(m.aliases.begin()->first);  // the alias is not stored
  ASSERT_EQ(m.tensors.size(), want.size());
  std::vector<TensorReadRequest> requests;
  for (size_t i = 0; i < m.tensors.size(); ++i) requests.push_back({i, nullptr});
  FP_ASSERT_OK_AND_ASSIGN(auto result, reader->read(requests, /*verify=*/true));
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const ManifestTensor& t = m.tensors[i];
    auto w = want.find(t.name);
    ASSERT_NE(w, want.end()) << t.name;
    EXPECT_EQ(t.dtype, w->second.dtype) << t.name;
    EXPECT_EQ(t.shape, w->second.shape) << t.name;
    ASSERT_EQ(t.length, w->second.bytes.size()) << t.name;
    if (t.length == 0) continue;
    EXPECT_EQ(
        "", first_difference(w->second.bytes, std::span<const std::byte>(result.data[i], t.length)))
        << t.name;
  }
  FP_ASSERT_OK_AND_ASSIGN(std::string objects, reader->read_objects());
  EXPECT_EQ(objects.substr(0, 2), "\x80\x04");  // the pickled sidecar, protocol 4
}

TEST_P(V1FixtureTest, VerifiesIntact) {
  auto engine = make_engine();
  ASSERT_NE(engine, nullptr);
  FP_ASSERT_OK_AND_ASSIGN(VerifyReport report, verify_checkpoint(dir(), *engine));
  EXPECT_TRUE(report.ok()) << joined(report.problems);
  EXPECT_TRUE(report.has_checksums);
  uint64_t total = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir())) {
    if (entry.path().filename() != "manifest.json") total += entry.file_size();
  }
  EXPECT_EQ(report.bytes_checked, total);
}

INSTANTIATE_TEST_SUITE_P(Steps, V1FixtureTest, ::testing::Values(10, 20),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return "step" + std::to_string(p.param);
                         });

}  // namespace
}  // namespace fastpersist::testing
