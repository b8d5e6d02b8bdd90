// SPDX-License-Identifier: Apache-2.0
#include "fastpersist/manifest.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "fastpersist/checksum.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"
#include "testing/test_util.h"

namespace fastpersist {
namespace {

const std::string kPath = "/ckpt/step-12/manifest.json";
const std::string kData = "tensors-00000-of-00001.safetensors";

Manifest sample() {
  Manifest m;
  m.tag = "step-12";
  m.step = 12;
  m.sequence = 3;
  m.created_unix = 1712345678.123456;
  m.versions = {{"fastpersist", "0.1.0"}, {"torch", "2.3.0"}};
  m.metadata_json = R"({"zeta":1,"lr":0.001,"nested":{"b":[1,2],"a":null},"name":"run \"7\""})";
  m.files = {{kData, "tensors", 4096 + 48 + 20 + 8, 0x1122334455667788u, 4096, {}},
             {"objects.pkl", "objects", 321, 0xfedcba9876543210u, 321, {}}};
  m.tensors = {{"layer.0.weight",
                "F64",
                {2, 3},
                kData,
                4096,
                48,
                0x0123456789abcdefu,
                "raw",
                48,
                {},
                {},
                {},
                {}},
               {"layer.0.bias", "F32", {5}, kData, 4096 + 48, 20, 1, "raw", 20, {}, {}, {}, {}},
               {"step_count", "I64", {}, kData, 4096 + 68, 8, 0, "raw", 8, {}, {}, {}, {}}};
  m.aliases = {{"lm_head.weight", "layer.0.weight"}};
  m.fingerprint = manifest_fingerprint(m.tensors);
  return m;
}

void expect_equal(const Manifest& a, const Manifest& b) {
  EXPECT_EQ(a.format_version, b.format_version);
  EXPECT_EQ(a.tag, b.tag);
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.sequence, b.sequence);
  EXPECT_EQ(a.created_unix, b.created_unix);
  EXPECT_EQ(a.checksum_algorithm, b.checksum_algorithm);
  EXPECT_EQ(a.versions, b.versions);
  EXPECT_EQ(a.fingerprint, b.fingerprint);
  EXPECT_EQ(a.metadata_json, b.metadata_json);
  EXPECT_EQ(a.aliases, b.aliases);
  EXPECT_EQ(a.world_size, b.world_size);
  ASSERT_EQ(a.files.size(), b.files.size());
  for (size_t i = 0; i < a.files.size(); ++i) {
    EXPECT_EQ(a.files[i].name, b.files[i].name);
    EXPECT_EQ(a.files[i].role, b.files[i].role);
    EXPECT_EQ(a.files[i].size, b.files[i].size);
    EXPECT_EQ(a.files[i].checksum, b.files[i].checksum);
    EXPECT_EQ(a.files[i].checksum_bytes, b.files[i].checksum_bytes);
    EXPECT_EQ(a.files[i].rank, b.files[i].rank);
  }
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    EXPECT_EQ(a.tensors[i].name, b.tensors[i].name);
    EXPECT_EQ(a.tensors[i].dtype, b.tensors[i].dtype);
    EXPECT_EQ(a.tensors[i].shape, b.tensors[i].shape);
    EXPECT_EQ(a.tensors[i].file, b.tensors[i].file);
    EXPECT_EQ(a.tensors[i].offset, b.tensors[i].offset);
    EXPECT_EQ(a.tensors[i].length, b.tensors[i].length);
    EXPECT_EQ(a.tensors[i].checksum, b.tensors[i].checksum);
    EXPECT_EQ(a.tensors[i].encoding, b.tensors[i].encoding);
    EXPECT_EQ(a.tensors[i].stored_length, b.tensors[i].stored_length);
    EXPECT_EQ(a.tensors[i].global_shape, b.tensors[i].global_shape);
    EXPECT_EQ(a.tensors[i].shard_offsets, b.tensors[i].shard_offsets);
  }
}

// Decoding `json` fails with kDataLoss, naming `field` and carrying the path.
void expect_rejected(const std::string& json, const std::string& field) {
  Result<Manifest> r = decode_manifest(json, kPath);
  ASSERT_FALSE(r.is_ok()) << "accepted; expected a complaint about " << field;
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().to_string();
  EXPECT_NE(r.status().message().find(field), std::string::npos) << r.status().to_string();
  EXPECT_EQ(r.status().path(), kPath);
}

void expect_rejected(const std::function<void(Manifest&)>& damage, const std::string& field) {
  Manifest m = sample();
  damage(m);
  expect_rejected(encode_manifest(m), field);
}

// The encoded sample with the first `from` replaced by `to` (which must be there).
std::string edited(const std::string& from, const std::string& to) {
  std::string json = encode_manifest(sample());
  size_t at = json.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? json : json.replace(at, from.size(), to);
}

TEST(ManifestTest, RoundTripKeepsEveryField) {
  const Manifest m = sample();
  FP_ASSERT_OK_AND_ASSIGN(Manifest back, decode_manifest(encode_manifest(m), kPath));
  expect_equal(m, back);
  // Encoding is deterministic: a decoded manifest encodes to the same bytes.
  EXPECT_EQ(encode_manifest(back), encode_manifest(m));
}

TEST(ManifestTest, RoundTripOfEdgeValues) {
  Manifest m = sample();
  m.step.reset();
  m.sequence = kMaxManifestSequence;
  m.created_unix = 0.1;
  m.metadata_json = "{}";
  m.versions.clear();
  m.aliases.clear();
  m.tensors.clear();
  m.files.clear();
  FP_ASSERT_OK_AND_ASSIGN(Manifest back, decode_manifest(encode_manifest(m), kPath));
  expect_equal(m, back);
  m.step = -5;
  FP_ASSERT_OK_AND_ASSIGN(Manifest negative, decode_manifest(encode_manifest(m), kPath));
  EXPECT_EQ(negative.step, -5);
}

TEST(ManifestTest, EncodingIsOneEntryPerLine) {
  const std::string json = encode_manifest(sample());
  EXPECT_EQ(json.substr(0, 2), "{\n");
  EXPECT_EQ(json.back(), '\n');
  EXPECT_NE(json.find("\n  \"format\": \"fastpersist-checkpoint\",\n"), std::string::npos);
  EXPECT_NE(json.find("\n  \"format_version\": 2,\n"), std::string::npos);
  EXPECT_NE(json.find("\n  \"world_size\": 1,\n"), std::string::npos);
  EXPECT_NE(json.find("\n  \"step\": 12,\n"), std::string::npos);
  EXPECT_NE(json.find("\n  \"checksum_algorithm\": \"xxh3-64\",\n"), std::string::npos);
  EXPECT_NE(json.find(R"("checksum":"0123456789abcdef")"), std::string::npos);
  EXPECT_NE(json.find("\n    {\"name\":\"layer.0.bias\",\"dtype\":\"F32\",\"shape\":[5],"),
            std::string::npos)
      << json;
  // The user's metadata keeps its key order.
  EXPECT_NE(json.find(R"("metadata": {"zeta":1,"lr":0.001,)"), std::string::npos) << json;
}

// The exact bytes of a small manifest: a change here is a format change (docs/format.md).
TEST(ManifestTest, GoldenEncoding) {
  Manifest m;
  m.tag = "t";
  m.step = 1;
  m.sequence = 2;
  m.created_unix = 1.5;
  m.versions = {{"fastpersist", "0.1.0"}};
  m.metadata_json = R"({"b":1,"a":[true]})";
  m.aliases = {{"tied", "w"}};
  m.files = {{kData, "tensors", 4104, 0xab, 4096, {}}, {"objects.pkl", "objects", 0, 0, 0, {}}};
  m.tensors = {{"w", "F32", {2}, kData, 4096, 8, 1, "raw", 8, {}, {}, {}, {}}};
  m.fingerprint = manifest_fingerprint(m.tensors);
  const std::string expected = R"({
  "format": "fastpersist-checkpoint",
  "format_version": 2,
  "tag": "t",
  "step": 1,
  "sequence": 2,
  "created_unix": 1.5,
  "checksum_algorithm": "xxh3-64",
  "versions": {"fastpersist":"0.1.0"},
  "fingerprint": "f12a4ab39c5dfe8f",
  "metadata": {"b":1,"a":[true]},
  "aliases": {"tied":"w"},
  "world_size": 1,
  "files": [
    {"name":"tensors-00000-of-00001.safetensors","role":"tensors","size":4104,)"
                               R"("checksum":"00000000000000ab","checksum_bytes":4096},
    {"name":"objects.pkl","role":"objects","size":0,"checksum":"0000000000000000",)"
                               R"("checksum_bytes":0}
  ],
  "tensors": [
    {"name":"w","dtype":"F32","shape":[2],"file":"tensors-00000-of-00001.safetensors",)"
                               R"("offset":4096,"length":8,"checksum":"0000000000000001",)"
                               R"("encoding":"raw","stored_length":8}
  ]
}
)";
  EXPECT_EQ(encode_manifest(m), expected);
  EXPECT_EQ(m.fingerprint, "f12a4ab39c5dfe8f");
}

TEST(ManifestTest, ContentHashFollowsTheValuesNotTheLayout) {
  Manifest a;
  a.tensors = {{"w", "F32", {2}, kData, 4096, 8, 11, "raw", 8, {}, {}, {}, {}},
               {"b", "U8", {3}, kData, 8192, 3, 22, "zstd", 2, {}, {}, {}, {}}};
  Manifest b = a;  // other files, offsets, encodings and order: the same values
  std::swap(b.tensors[0], b.tensors[1]);
  b.tensors[0].file = "other.safetensors";
  b.tensors[0].encoding = "raw";
  b.tensors[1].offset = 0;
  EXPECT_EQ(manifest_content_hash(a), manifest_content_hash(b));
  EXPECT_EQ(manifest_content_hash(a).size(), 16u);
  Manifest c = a;
  c.tensors[1].checksum = 23;  // one value changed
  EXPECT_NE(manifest_content_hash(a), manifest_content_hash(c));
  Manifest d = a;
  d.tensors[0].shard_offsets = {0};  // a block of a larger tensor is not the whole tensor
  d.tensors[0].global_shape = {2};
  EXPECT_NE(manifest_content_hash(a), manifest_content_hash(d));
  Manifest e = a;
  e.checksum_algorithm = std::string(kNoChecksum);
  EXPECT_EQ(manifest_content_hash(e), "");
}

TEST(ManifestTest, InvalidMetadataIsWrittenAsEmptyObject) {
  Manifest m = sample();
  m.metadata_json = "[1, 2]";
  FP_ASSERT_OK_AND_ASSIGN(Manifest back, decode_manifest(encode_manifest(m), kPath));
  EXPECT_EQ(back.metadata_json, "{}");
}

TEST(ManifestTest, Accessors) {
  const Manifest m = sample();
  EXPECT_EQ(m.tensor_bytes(), 48u + 20u + 8u);
  EXPECT_EQ(m.find_tensor("layer.0.bias"), 1u);
  EXPECT_FALSE(m.find_tensor("lm_head.weight").has_value());  // an alias, not a stored tensor
  ASSERT_NE(m.find_file("objects.pkl"), nullptr);
  EXPECT_EQ(m.find_file("objects.pkl")->size, 321u);
  EXPECT_EQ(m.find_file("nope"), nullptr);
}

TEST(ManifestTest, FingerprintDependsOnlyOnNamesDtypesAndShapes) {
  const Manifest m = sample();
  std::vector<ManifestTensor> tensors = m.tensors;
  std::reverse(tensors.begin(), tensors.end());
  EXPECT_EQ(manifest_fingerprint(tensors), m.fingerprint);
  tensors[0].offset += 4096;
  tensors[0].checksum = 99;
  tensors[0].file = "other";
  EXPECT_EQ(manifest_fingerprint(tensors), m.fingerprint);
  for (const auto& change : std::vector<std::function<void(ManifestTensor&)>>{
           [](ManifestTensor& t) { t.name += "x"; }, [](ManifestTensor& t) { t.dtype = "F16"; },
           [](ManifestTensor& t) { t.shape.push_back(1); }}) {
    std::vector<ManifestTensor> changed = m.tensors;
    change(changed[1]);
    EXPECT_NE(manifest_fingerprint(changed), m.fingerprint);
  }
  // Defined as xxh3 of the sorted "name:dtype:dims" lines joined by '\n'.
  const std::string lines = "layer.0.bias:F32:5\nlayer.0.weight:F64:2,3\nstep_count:I64:";
  EXPECT_EQ(m.fingerprint, checksum_to_hex(xxh3_64(lines.data(), lines.size())));
  EXPECT_EQ(manifest_fingerprint({}), "2d06800538d394c2");
}

TEST(ManifestTest, RejectsStructuralDamage) {
  expect_rejected("", "not valid JSON");
  expect_rejected("{\"format\":", "not valid JSON");
  expect_rejected("[]", "not a JSON object");
  expect_rejected(edited("\"tag\": \"step-12\",", "\"tag\": \"step-12\", \"tag\": \"x\","),
                  "appears twice");
  expect_rejected(edited("  \"sequence\": 3,\n", ""), "'sequence' is missing");
  expect_rejected(edited("\"fastpersist-checkpoint\"", "\"something-else\""), "'format'");
  expect_rejected(edited("\"format_version\": 2", "\"format_version\": 3"), "newer fastpersist");
  expect_rejected(edited("\"format_version\": 2", "\"format_version\": 0"), "'format_version'");
  expect_rejected(edited("\"format_version\": 2", "\"format_version\": -1"), "'format_version'");
  expect_rejected(edited("\"format_version\": 2", "\"format_version\": \"2\""), "'format_version'");
  expect_rejected(edited("\"step\": 12", "\"step\": \"12\""), "'step'");
  expect_rejected(edited("\"step\": 12", "\"step\": 1.5"), "'step'");
  expect_rejected(edited("\"sequence\": 3", "\"sequence\": -3"), "'sequence'");
  // A sequence the next save's (+ 1) could wrap, or that no commit gives.
  expect_rejected(edited("\"sequence\": 3", "\"sequence\": 18446744073709551615"),
                  "'sequence' is 18446744073709551615");
  expect_rejected(edited("\"sequence\": 3", "\"sequence\": 4611686018427387905"), "'sequence'");
  expect_rejected(edited("\"sequence\": 3", "\"sequence\": 0"), "'sequence' is 0");
  expect_rejected(edited("\"created_unix\": 1712345678.123456", "\"created_unix\": null"),
                  "'created_unix'");
  expect_rejected(edited("\"torch\":\"2.3.0\"", "\"torch\":2"), "'versions.torch'");
  expect_rejected(edited("\"metadata\": {", "\"metadata\": [{}], \"x\": {"), "'metadata'");
  expect_rejected(edited("\"files\": [", "\"files\": 7, \"x\": ["), "'files'");
  expect_rejected(edited("\"tensors\": [", "\"tensors\": 7, \"x\": ["), "'tensors'");
  expect_rejected(edited("\"checksum\":\"0123456789abcdef\"", "\"checksum\":\"0123456789ABCDEF\""),
                  "'tensors[0].checksum'");
  expect_rejected(edited("\"shape\":[5]", "\"shape\":[-5]"), "'tensors[1].shape'");
  expect_rejected(edited("\"size\":321", "\"size\":-1"), "'files[1].size'");
  expect_rejected(edited("\"checksum_bytes\":321", "\"checksum_bytes\":\"321\""),
                  "'files[1].checksum_bytes'");
}

TEST(ManifestTest, NoChecksumsMeansEveryChecksumIsZero) {
  Manifest m = sample();
  m.checksum_algorithm = std::string(kNoChecksum);
  for (ManifestFile& f : m.files) f.checksum = 0;
  for (ManifestTensor& t : m.tensors) t.checksum = 0;
  FP_ASSERT_OK_AND_ASSIGN(Manifest back, decode_manifest(encode_manifest(m), kPath));
  EXPECT_EQ(back.checksum_algorithm, kNoChecksum);
}

TEST(ManifestTest, RejectsNestingDeeperThanReadersWalk) {
  // 200,000 levels overflowed the stack of whatever walked the metadata (SIGSEGV); the parser
  // stops at 256, with nothing recursive on the way.
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  expect_rejected(edited("\"metadata\": {", "\"deep\": " + deep + ", \"metadata\": {"),
                  "nested deeper than 256 levels");
  // 254 arrays in the metadata object in the manifest's object: 256 levels, the most allowed.
  const std::string ok = std::string(254, '[') + std::string(254, ']');
  Manifest m = sample();
  m.metadata_json = "{\"a\": " + ok + "}";
  FP_ASSERT_OK_AND_ASSIGN(Manifest back, decode_manifest(encode_manifest(m), kPath));
  EXPECT_EQ(back.metadata_json, m.metadata_json.substr(0, 5) + ok + "}");
  m.metadata_json = "{\"a\": " + std::string(255, '[') + std::string(255, ']') + "}";
  EXPECT_EQ(check_metadata_json(m.metadata_json).code(), StatusCode::kInvalidArgument);
  EXPECT_NE(check_metadata_json(m.metadata_json).message().find("nested deeper"),
            std::string::npos);
  // encode_manifest never walks what check_metadata_json refuses: it writes {} instead.
  FP_ASSERT_OK_AND_ASSIGN(Manifest blank, decode_manifest(encode_manifest(m), kPath));
  EXPECT_EQ(blank.metadata_json, "{}");
  EXPECT_TRUE(check_metadata_json("{\"x\": [1, {\"y\": null}]}").is_ok());
  EXPECT_FALSE(check_metadata_json("[1]").is_ok());
  EXPECT_FALSE(check_metadata_json("{\"a\": 1, \"a\": 2}").is_ok());
}

TEST(ManifestTest, RejectsBadValues) {
  expect_rejected([](Manifest& m) { m.tag = ""; }, "'tag'");
  expect_rejected([](Manifest& m) { m.checksum_algorithm = "md5"; }, "'checksum_algorithm'");
  // "none" with checksums in place: altered so that verify would skip them.
  expect_rejected([](Manifest& m) { m.checksum_algorithm = std::string(kNoChecksum); },
                  "'checksum_algorithm' is \"none\" but files[0].checksum is set");
  expect_rejected(
      [](Manifest& m) {
        m.checksum_algorithm = std::string(kNoChecksum);
        for (ManifestFile& f : m.files) f.checksum = 0;
      },
      "'checksum_algorithm' is \"none\" but tensors[0].checksum is set");
  expect_rejected([](Manifest& m) { m.files[1].name = "../objects.pkl"; }, "'files[1].name'");
  expect_rejected([](Manifest& m) { m.files[1].name = ".."; }, "'files[1].name'");
  expect_rejected([](Manifest& m) { m.files[1].name = "."; }, "'files[1].name'");
  expect_rejected([](Manifest& m) { m.files[1].name = ""; }, "'files[1].name'");
  expect_rejected([](Manifest& m) { m.files[1].name = kData; }, "'files[1].name'");
  expect_rejected([](Manifest& m) { m.files[1].role = "blob"; }, "'files[1].role'");
  expect_rejected([](Manifest& m) { m.files[1].checksum_bytes = 322; },
                  "'files[1].checksum_bytes'");
  expect_rejected([](Manifest& m) { m.tensors[1].file = "missing.safetensors"; },
                  "'tensors[1].file'");
  expect_rejected([](Manifest& m) { m.tensors[1].file = "objects.pkl"; }, "'tensors[1].file'");
  expect_rejected([](Manifest& m) { m.tensors[2].offset = m.files[0].size - 4; },
                  "'tensors[2].stored_length'");
  expect_rejected([](Manifest& m) { m.tensors[2].offset = UINT64_MAX - 2; },
                  "'tensors[2].stored_length'");
  expect_rejected([](Manifest& m) { m.tensors[1].length = 24; }, "'tensors[1].length'");
  expect_rejected([](Manifest& m) { m.tensors[1].shape = {UINT64_MAX, 2}; }, "'tensors[1].length'");
  expect_rejected([](Manifest& m) { m.tensors[1].dtype = "F128"; }, "'tensors[1].dtype'");
  expect_rejected([](Manifest& m) { m.tensors[1].name = ""; }, "'tensors[1].name'");
  expect_rejected([](Manifest& m) { m.tensors[1].name = "layer.0.weight"; }, "'tensors[1].name'");
  expect_rejected([](Manifest& m) { m.aliases["ghost"] = "nowhere"; }, "'aliases.ghost'");
  expect_rejected([](Manifest& m) { m.aliases["layer.0.bias"] = "layer.0.weight"; },
                  "'aliases.layer.0.bias'");
  expect_rejected([](Manifest& m) { m.aliases["x"] = "lm_head.weight"; }, "'aliases.x'");
}

TEST(ManifestTest, ReadManifestFromDirectory) {
  testing::TempDir dir;
  Result<Manifest> missing = read_manifest(dir.path());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status().to_string();
  EXPECT_EQ(missing.status().path(), dir.file("manifest.json"));

  const std::string json = encode_manifest(sample());
  FP_ASSERT_OK(
      testing::write_whole_file(dir.file("manifest.json"), std::as_bytes(std::span(json))));
  FP_ASSERT_OK_AND_ASSIGN(Manifest m, read_manifest(dir.path()));
  expect_equal(sample(), m);

  const std::string torn = json.substr(0, json.size() / 2);
  FP_ASSERT_OK(
      testing::write_whole_file(dir.file("manifest.json"), std::as_bytes(std::span(torn))));
  Result<Manifest> r = read_manifest(dir.path());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(r.status().path(), dir.file("manifest.json"));
}

}  // namespace
}  // namespace fastpersist
