// SPDX-License-Identifier: Apache-2.0
// Format 2 of the manifest: its fields round trip, each of its checks rejects what it should,
// format 1 still decodes (with the v2 fields at their v1 meaning), a newer version is named,
// file references resolve under the root, and the shared tag and encoding rules.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "fastpersist/checkpoint.h"
#include "fastpersist/manifest.h"
#include "fastpersist/manifest_index.h"
#include "fastpersist/tensor_codec.h"
#include "testing/status_matchers.h"

namespace fastpersist {
namespace {

const std::string kPath = "/root/step-2/manifest.json";
const std::string kOwn = "tensors-00000-of-00001.safetensors";
const std::string kBase = "step-1/tensors-00000-of-00001.safetensors";

// A distributed, incremental v2 manifest: rank-tagged files, one referring into step-1, a
// sharded tensor and a tensor in an encoding this build does not know.
Manifest distributed() {
  Manifest m;
  m.tag = "step-2";
  m.step = 2;
  m.sequence = 2;
  m.created_unix = 7.25;
  m.world_size = 4;
  m.files = {{kOwn, "tensors", 4096 + 64, 0x11, 4096, 3},
             {kBase, "tensors", 4096 + 32, 0x22, 4096, 0},
             {"objects.pkl", "objects", 10, 0x33, 10, std::nullopt}};
  m.tensors = {
      {"experts.3.w", "F32", {2, 4}, kOwn, 4096, 32, 0xa, "raw", 32, {8, 4}, {6, 0}, {}, {}},
      {"experts.3.b",
       "F16",
       {16},
       kOwn,
       4096 + 32,
       32,
       0xb,
       "zstd-1",
       20,
       {},
       {},
       ContentDigest{1, 2},
       {}},
      {"embed", "BF16", {4, 4}, kBase, 4096, 32, 0xc, "raw", 32, {}, {}, {}, {}},
  };
  m.fingerprint = manifest_fingerprint(m.tensors);
  return m;
}

void expect_rejected(const std::function<void(Manifest&)>& damage, const std::string& field,
                     const std::string& why = "") {
  Manifest m = distributed();
  damage(m);
  Result<Manifest> r = decode_manifest(encode_manifest(m), kPath);
  ASSERT_FALSE(r.is_ok()) << "accepted; expected a complaint about " << field;
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().to_string();
  EXPECT_NE(r.status().message().find("'" + field + "'"), std::string::npos)
      << r.status().to_string();
  EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().to_string();
  EXPECT_EQ(r.status().path(), kPath);
}

// The encoding of `m` with `from` replaced by `to` everywhere.
std::string replaced(const Manifest& m, const std::string& from, const std::string& to) {
  std::string json = encode_manifest(m);
  EXPECT_NE(json.find(from), std::string::npos) << from;
  for (size_t at = json.find(from); at != std::string::npos; at = json.find(from, at + to.size())) {
    json.replace(at, from.size(), to);
  }
  return json;
}

TEST(ManifestV2Test, RoundTripOfEveryV2Field) {
  const Manifest m = distributed();
  FP_ASSERT_OK_AND_ASSIGN(Manifest back, decode_manifest(encode_manifest(m), kPath));
  EXPECT_EQ(back.format_version, 2);
  EXPECT_EQ(back.world_size, 4u);
  ASSERT_EQ(back.files.size(), 3u);
  EXPECT_EQ(back.files[0].rank, 3u);
  EXPECT_EQ(back.files[1].rank, 0u);
  EXPECT_EQ(back.files[1].name, kBase);
  EXPECT_EQ(back.files[2].rank, std::nullopt);
  ASSERT_EQ(back.tensors.size(), 3u);
  EXPECT_EQ(back.tensors[0].global_shape, (std::vector<uint64_t>{8, 4}));
  EXPECT_EQ(back.tensors[0].shard_offsets, (std::vector<uint64_t>{6, 0}));
  EXPECT_EQ(back.tensors[1].encoding, "zstd-1");
  EXPECT_EQ(back.tensors[1].stored_length, 20u);
  EXPECT_EQ(back.tensors[1].length, 32u);
  EXPECT_EQ(back.tensors[2].file, kBase);
  EXPECT_EQ(back.tensors[1].digest, (ContentDigest{1, 2}));
  EXPECT_EQ(back.tensors[0].digest, std::nullopt);
  EXPECT_EQ(encode_manifest(back), encode_manifest(m));
}

TEST(ManifestV2Test, RejectsADigestThatIsNot32HexDigits) {
  const std::string good = encode_manifest(distributed());
  const std::string digest = R"("xxh3_128":"00000000000000010000000000000002")";
  ASSERT_NE(good.find(digest), std::string::npos);
  for (const char* bad :
       {R"("xxh3_128":"0000000000000001000000000000000")",
        R"("xxh3_128":"0000000000000001000000000000000G")",
        R"("xxh3_128":"00000000000000010000000000000002A")", R"("xxh3_128":12)"}) {
    std::string json = good;
    json.replace(json.find(digest), digest.size(), bad);
    auto m = decode_manifest(json, kPath);
    ASSERT_FALSE(m.is_ok()) << bad;
    EXPECT_EQ(m.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(m.status().message().find("tensors[1].xxh3_128"), std::string::npos)
        << m.status().to_string();
  }
}

TEST(ManifestV2Test, OptionalFieldsAreWrittenOnlyWhenSet) {
  const std::string json = encode_manifest(distributed());
  EXPECT_NE(json.find(R"("checksum_bytes":4096,"rank":3})"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("checksum_bytes":10})"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("stored_length":32,"global_shape":[8,4],"shard_offsets":[6,0]})"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find(R"("encoding":"zstd-1","stored_length":20,)"
                      R"("xxh3_128":"00000000000000010000000000000002"})"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find(R"("stored_length":32})"), std::string::npos) << json;  // no digest
  EXPECT_NE(json.find("\n  \"world_size\": 4,\n"), std::string::npos) << json;
}

TEST(ManifestV2Test, BlockingSecondsIsOptionalAndChecked) {
  Manifest m = distributed();
  EXPECT_EQ(encode_manifest(m).find("blocking_seconds"), std::string::npos);
  FP_ASSERT_OK_AND_ASSIGN(Manifest none, decode_manifest(encode_manifest(m), kPath));
  EXPECT_EQ(none.blocking_seconds, std::nullopt);
  m.blocking_seconds = 0.375;
  FP_ASSERT_OK_AND_ASSIGN(Manifest back, decode_manifest(encode_manifest(m), kPath));
  EXPECT_EQ(back.blocking_seconds, 0.375);
  for (const char* bad : {"-1", "\"3\"", "null", "true"}) {
    auto r = decode_manifest(
        replaced(m, "\"blocking_seconds\": 0.375", std::string("\"blocking_seconds\": ") + bad),
        kPath);
    ASSERT_FALSE(r.is_ok()) << bad;
    EXPECT_NE(r.status().message().find("'blocking_seconds'"), std::string::npos)
        << r.status().to_string();
  }
}

TEST(ManifestV2Test, EncodeWritesTheCurrentVersionWhateverTheFieldSays) {
  Manifest m = distributed();
  m.format_version = 1;  // e.g. decoded from a v1 manifest
  FP_ASSERT_OK_AND_ASSIGN(Manifest back, decode_manifest(encode_manifest(m), kPath));
  EXPECT_EQ(back.format_version, kManifestFormatVersion);
}

TEST(ManifestV2Test, RejectsEachBadV2Field) {
  expect_rejected([](Manifest& m) { m.world_size = 0; }, "world_size");
  expect_rejected([](Manifest& m) { m.files[0].rank = 4; }, "files[0].rank", "world_size 4");
  expect_rejected([](Manifest& m) { m.tensors[1].encoding = "Zstd"; }, "tensors[1].encoding");
  expect_rejected([](Manifest& m) { m.tensors[1].encoding = ""; }, "tensors[1].encoding");
  expect_rejected([](Manifest& m) { m.tensors[1].encoding = "zstd/1"; }, "tensors[1].encoding");
  expect_rejected([](Manifest& m) { m.tensors[1].encoding = std::string(65, 'a'); },
                  "tensors[1].encoding");
  expect_rejected([](Manifest& m) { m.tensors[0].stored_length = 31; }, "tensors[0].stored_length",
                  "raw tensor");
  expect_rejected([](Manifest& m) { m.tensors[1].stored_length = 4096; },
                  "tensors[1].stored_length", "runs past the end");
  expect_rejected([](Manifest& m) { m.tensors[1].stored_length = UINT64_MAX; },
                  "tensors[1].stored_length", "runs past the end");
  // No codec turns 20 stored bytes into 2^40: refused before a load allocates the claimed size.
  expect_rejected(
      [](Manifest& m) {
        m.tensors[1].encoding = "zstd";
        m.tensors[1].shape = {uint64_t{1} << 39};
        m.tensors[1].length = uint64_t{1} << 40;
      },
      "tensors[1].stored_length", "cannot hold");
  expect_rejected(
      [](Manifest& m) {
        m.tensors[1].encoding = "lz4";
        m.tensors[1].shape = {20 * kCodecMaxExpansion / 2 + 1};
        m.tensors[1].length = 20 * kCodecMaxExpansion + 2;
      },
      "tensors[1].stored_length", "cannot hold");
  expect_rejected([](Manifest& m) { m.tensors[0].shard_offsets = {6}; },
                  "tensors[0].shard_offsets");
  expect_rejected([](Manifest& m) { m.tensors[0].shard_offsets.clear(); },
                  "tensors[0].shard_offsets");
  expect_rejected(
      [](Manifest& m) {
        m.tensors[0].global_shape = {8, 4, 1};
        m.tensors[0].shard_offsets = {0, 0, 0};
      },
      "tensors[0].global_shape");
  expect_rejected(
      [](Manifest& m) {
        m.tensors[0].shard_offsets = {7, 0};
      },
      "tensors[0].shard_offsets", "past the global extent 8");
  expect_rejected(
      [](Manifest& m) {
        m.tensors[0].shard_offsets = {UINT64_MAX, 0};
      },
      "tensors[0].shard_offsets");
  // offset + extent would wrap around 2^64 and look small: it must still be refused.
  expect_rejected(
      [](Manifest& m) {
        m.tensors[0].global_shape = {UINT64_MAX, 4};
        m.tensors[0].shard_offsets = {UINT64_MAX - 1, 0};
      },
      "tensors[0].shard_offsets");
}

TEST(ManifestV2Test, RejectsReferencesThatLeaveTheRootOrPointAtThemselves) {
  const std::string field = "files[1].name";
  for (const std::string& bad :
       {std::string("../step-1/x"), std::string("step-1/../x"), std::string("step-1/.."),
        std::string("step-1/."), std::string("/etc/passwd"), std::string("step-1/a/b"),
        std::string("step-1/"), std::string("/x"), std::string(".tmp-1/x"), std::string("latest/x"),
        std::string("step 1/x"), std::string("step-2/x"), std::string("step-1/a\0b", 10),
        std::string(201, 'a') + "/x"}) {
    SCOPED_TRACE(bad);
    expect_rejected(
        [&](Manifest& m) {
          m.files[1].name = bad;
          m.tensors[2].file = bad;
        },
        field);
  }
}

TEST(ManifestV2Test, NoReferencesInAVersion1Manifest) {
  Manifest m = distributed();
  m.tensors.resize(1);
  m.tensors[0].global_shape.clear();
  m.tensors[0].shard_offsets.clear();
  m.files.erase(m.files.begin() + 1);
  m.files[0].rank.reset();
  m.files.push_back({"step-1/objects.pkl", "objects", 0, 0, 0, std::nullopt});
  Result<Manifest> r =
      decode_manifest(replaced(m, "\"format_version\": 2", "\"format_version\": 1"), kPath);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("'files[2].name'"), std::string::npos)
      << r.status().to_string();
}

TEST(ManifestV2Test, FutureVersionSaysWhoWroteItAndWhatThisOneReads) {
  Result<Manifest> r = decode_manifest(
      replaced(distributed(), "\"format_version\": 2", "\"format_version\": 7"), kPath);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("written by a newer fastpersist (format version 7); this "
                                      "one reads versions 1 to 2"),
            std::string::npos)
      << r.status().to_string();
  EXPECT_EQ(r.status().path(), kPath);
}

// A manifest as fastpersist 0.1 wrote it (format 1: no encoding, stored_length, world_size,
// rank), byte for byte.
const char* const kVersion1 = R"({
  "format": "fastpersist-checkpoint",
  "format_version": 1,
  "tag": "t",
  "step": 1,
  "sequence": 2,
  "created_unix": 1.5,
  "checksum_algorithm": "xxh3-64",
  "versions": {"fastpersist":"0.1.0"},
  "fingerprint": "f12a4ab39c5dfe8f",
  "metadata": {"b":1,"a":[true]},
  "aliases": {"tied":"w"},
  "files": [
    {"name":"tensors-00000-of-00001.safetensors","role":"tensors","size":4104,"checksum":"00000000000000ab","checksum_bytes":4096},
    {"name":"objects.pkl","role":"objects","size":0,"checksum":"0000000000000000","checksum_bytes":0}
  ],
  "tensors": [
    {"name":"w","dtype":"F32","shape":[2],"file":"tensors-00000-of-00001.safetensors","offset":4096,"length":8,"checksum":"0000000000000001"}
  ]
}
)";

TEST(ManifestV2Test, Version1DecodesWithV2FieldsAtTheirV1Meaning) {
  FP_ASSERT_OK_AND_ASSIGN(Manifest m, decode_manifest(kVersion1, kPath));
  EXPECT_EQ(m.format_version, 1);
  EXPECT_EQ(m.world_size, 1u);
  ASSERT_EQ(m.files.size(), 2u);
  EXPECT_EQ(m.files[0].rank, std::nullopt);
  ASSERT_EQ(m.tensors.size(), 1u);
  EXPECT_EQ(m.tensors[0].encoding, "raw");
  EXPECT_EQ(m.tensors[0].stored_length, 8u);
  EXPECT_TRUE(m.tensors[0].global_shape.empty());
  EXPECT_EQ(m.aliases.at("tied"), "w");
  FP_EXPECT_OK(check_encoding_supported(m.tensors[0]));
  // v2 fields in a v1 manifest mean nothing to a v1 reader, so they are ignored here too.
  std::string with_v2_fields = kVersion1;
  with_v2_fields.replace(with_v2_fields.find("\"aliases\""), 0, "\"world_size\": 0, ");
  FP_ASSERT_OK_AND_ASSIGN(Manifest lenient, decode_manifest(with_v2_fields, kPath));
  EXPECT_EQ(lenient.world_size, 1u);
}

TEST(ManifestV2Test, Version2RequiresItsFields) {
  const Manifest m = distributed();
  for (const auto& [from, to, field] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"  \"world_size\": 4,\n", "", "'world_size' is missing"},
           {"\"world_size\": 4", "\"world_size\": -4", "'world_size'"},
           {"\"world_size\": 4", "\"world_size\": 4294967296", "'world_size'"},
           {",\"encoding\":\"zstd-1\"", "", "'tensors[1].encoding' is missing"},
           {",\"stored_length\":20", "", "'tensors[1].stored_length' is missing"},
           {"\"rank\":3", "\"rank\":\"3\"", "'files[0].rank'"},
           {"\"global_shape\":[8,4]", "\"global_shape\":[8,-4]", "'tensors[0].global_shape'"},
           {"\"shard_offsets\":[6,0]", "\"shard_offsets\":{}", "'tensors[0].shard_offsets'"}}) {
    Result<Manifest> r = decode_manifest(replaced(m, from, to), kPath);
    ASSERT_FALSE(r.is_ok()) << from;
    EXPECT_NE(r.status().message().find(field), std::string::npos) << r.status().to_string();
  }
}

TEST(ManifestV2Test, FilePathsResolveInsideTheRoot) {
  const Manifest m = distributed();
  EXPECT_EQ(manifest_file_path("/r/step-2", m.files[0]), "/r/step-2/" + kOwn);
  EXPECT_EQ(manifest_file_path("/r/step-2/", m.files[0]), "/r/step-2/" + kOwn);
  EXPECT_EQ(manifest_file_path("/r/step-2", m.files[1]), "/r/" + kBase);
  EXPECT_EQ(manifest_file_path("/r/step-2//", m.files[1]), "/r/" + kBase);
  EXPECT_EQ(manifest_file_path("step-2", m.files[1]), "./" + kBase);
  EXPECT_EQ(manifest_file_path("/step-2", m.files[1]), "/" + kBase);
  EXPECT_EQ(referenced_checkpoint(m.files[1]), "step-1");
  EXPECT_EQ(referenced_checkpoint(m.files[0]), "");
}

TEST(ManifestV2Test, TagSyntaxIsOneRuleForTheManagerAndTheManifest) {
  for (const std::string& good :
       {std::string("step-1"), std::string("a"), std::string("v1.2_rc-3"), std::string(200, 'x')}) {
    FP_EXPECT_OK(check_tag_syntax(good));
    FP_EXPECT_OK(validate_tag(good));
  }
  for (const std::string& bad :
       {std::string(), std::string(201, 'x'), std::string(".tmp"), std::string("latest"),
        std::string("a/b"), std::string(".."), std::string("a b"), std::string("\xc3\xa9")}) {
    Status format_rule = check_tag_syntax(bad);
    Status manager_rule = validate_tag(bad);
    EXPECT_EQ(format_rule.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(manager_rule.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(format_rule.message(), manager_rule.message());
  }
}

TEST(ManifestV2Test, UnknownEncodingDecodesButIsRefusedForReading) {
  FP_ASSERT_OK_AND_ASSIGN(Manifest m, decode_manifest(encode_manifest(distributed()), kPath));
  FP_EXPECT_OK(check_encoding_supported(m.tensors[0]));
  Status st = check_encoding_supported(m.tensors[1]);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("tensor 'experts.3.b': encoding \"zstd-1\" is not supported by this "
                              "fastpersist"),
            std::string::npos)
      << st.to_string();
}

TEST(ManifestV2Test, IndexFindsTensorsAndFilesByName) {
  const Manifest m = distributed();
  const ManifestIndex index(m);
  EXPECT_EQ(index.tensor("embed"), 2u);
  EXPECT_EQ(index.tensor("experts.3.w"), 0u);
  EXPECT_EQ(index.tensor("nope"), std::nullopt);
  EXPECT_EQ(index.file(kBase), 1u);
  EXPECT_EQ(index.file("objects.pkl"), 2u);
  EXPECT_EQ(index.file("step-1"), std::nullopt);
  EXPECT_EQ(std::vector<size_t>(index.tensors_in(0).begin(), index.tensors_in(0).end()),
            (std::vector<size_t>{0, 1}));
  EXPECT_EQ(std::vector<size_t>(index.tensors_in(1).begin(), index.tensors_in(1).end()),
            (std::vector<size_t>{2}));
  EXPECT_TRUE(index.tensors_in(2).empty());
  EXPECT_TRUE(index.tensors_in(99).empty());
}

}  // namespace
}  // namespace fastpersist

namespace fastpersist {
namespace {

// distributed() with its second tensor stored as an XOR delta against the raw "embed" bytes
// of step-1 (same length: 32 bytes).
Manifest with_delta() {
  Manifest m = distributed();
  m.tensors[1].encoding = std::string(kEncodingXorZstd);
  m.tensors[1].delta_base = DeltaBase{kBase, 4096, 32, "raw", 0xd};
  return m;
}

void expect_delta_rejected(const std::function<void(Manifest&)>& damage, const std::string& field,
                           const std::string& why) {
  Manifest m = with_delta();
  damage(m);
  Result<Manifest> r = decode_manifest(encode_manifest(m), kPath);
  ASSERT_FALSE(r.is_ok()) << "accepted; expected a complaint about " << field;
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().to_string();
  EXPECT_NE(r.status().message().find("'" + field + "'"), std::string::npos)
      << r.status().to_string();
  EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().to_string();
}

TEST(ManifestDeltaTest, ADeltaBaseRoundTripsAndIsSupported) {
  const Manifest m = with_delta();
  const std::string json = encode_manifest(m);
  EXPECT_NE(
      json.find(R"("delta_base":{"file":"step-1/tensors-00000-of-00001.safetensors","offset":4096,)"
                R"("stored_length":32,"encoding":"raw","checksum":"000000000000000d"})"),
      std::string::npos)
      << json;
  FP_ASSERT_OK_AND_ASSIGN(Manifest back, decode_manifest(json, kPath));
  EXPECT_EQ(back.tensors[1].delta_base, m.tensors[1].delta_base);
  EXPECT_EQ(back.tensors[0].delta_base, std::nullopt);
  FP_EXPECT_OK(check_encoding_supported(back.tensors[1]));
  EXPECT_EQ(encode_manifest(back), json);
}

TEST(ManifestDeltaTest, RejectsEveryBadDeltaBase) {
  expect_delta_rejected([](Manifest& m) { m.tensors[1].delta_base.reset(); },
                        "tensors[1].delta_base", "is missing");
  expect_delta_rejected([](Manifest& m) { m.tensors[1].encoding = "zstd"; },
                        "tensors[1].delta_base", "only for encoding");
  expect_delta_rejected(
      [](Manifest& m) { m.tensors[1].delta_base->file = "step-1/other.safetensors"; },
      "tensors[1].delta_base.file", "not listed");
  expect_delta_rejected([](Manifest& m) { m.tensors[1].delta_base->file = "objects.pkl"; },
                        "tensors[1].delta_base.file", "not listed");
  // Chains stay one step long: a base is never itself a delta.
  expect_delta_rejected([](Manifest& m) { m.tensors[1].delta_base->encoding = "xor-zstd"; },
                        "tensors[1].delta_base.encoding", "not one a base can have");
  expect_delta_rejected([](Manifest& m) { m.tensors[1].delta_base->encoding = "zstd-9"; },
                        "tensors[1].delta_base.encoding", "not one a base can have");
  expect_delta_rejected([](Manifest& m) { m.tensors[1].delta_base->stored_length = 31; },
                        "tensors[1].delta_base.stored_length", "raw base");
  expect_delta_rejected(
      [](Manifest& m) {
        m.tensors[1].delta_base->encoding = "zstd";
        m.tensors[1].delta_base->stored_length = UINT64_MAX;
      },
      "tensors[1].delta_base.stored_length", "runs past the end");
  expect_delta_rejected(
      [](Manifest& m) {
        m.tensors[1].delta_base->encoding = "zstd";
        m.tensors[1].delta_base->stored_length = 0;
      },
      "tensors[1].delta_base.stored_length", "cannot hold");
  expect_delta_rejected([](Manifest& m) { m.tensors[1].delta_base->offset = 4097; },
                        "tensors[1].delta_base.stored_length", "runs past the end");
  // A hand-made manifest whose base is not an object, or lacks a field.
  std::string json = encode_manifest(with_delta());
  const std::string object = json.substr(json.find("\"delta_base\":") + 13);
  std::string bad = json;
  bad.replace(bad.find(object.substr(0, object.find('}') + 1)), object.find('}') + 1, "[1]");
  auto r = decode_manifest(bad, kPath);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("tensors[1].delta_base' is not an object"), std::string::npos)
      << r.status().to_string();
  bad = json;
  const std::string checksum = R"(,"checksum":"000000000000000d")";
  bad.replace(bad.find(checksum), checksum.size(), "");
  r = decode_manifest(bad, kPath);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("tensors[1].delta_base.checksum' is missing"),
            std::string::npos)
      << r.status().to_string();
}

}  // namespace
}  // namespace fastpersist
