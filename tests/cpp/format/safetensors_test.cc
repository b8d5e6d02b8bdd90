// SPDX-License-Identifier: Apache-2.0
#include "fastpersist/safetensors.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "testing/status_matchers.h"
#include "testing/temp_dir.h"
#include "testing/test_util.h"

namespace fastpersist {
namespace {

const std::string kPath = "model.safetensors";

std::string le64(uint64_t v) {
  std::string out(8, '\0');
  for (size_t i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

// A file as another writer might lay it out: length, `json` as given, `data_bytes` zero bytes.
std::string raw_file(const std::string& json, uint64_t data_bytes) {
  return le64(json.size()) + json + std::string(data_bytes, '\0');
}

Result<SafetensorsHeader> parse(const std::string& file) {
  return parse_safetensors_header(file, file.size(), kPath);
}

// `json` with `data_bytes` of data must be rejected as damage, for a reason naming `needle`.
void expect_damaged(const std::string& json, uint64_t data_bytes, const std::string& needle) {
  Result<SafetensorsHeader> r = parse(raw_file(json, data_bytes));
  ASSERT_FALSE(r.is_ok()) << json;
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().to_string();
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().to_string();
  EXPECT_EQ(r.status().path(), kPath);
}

std::string f32(const std::string& shape, uint64_t begin, uint64_t end) {
  return R"({"dtype":"F32","shape":)" + shape + R"(,"data_offsets":[)" + std::to_string(begin) +
         "," + std::to_string(end) + "]}";
}

void expect_same(const SafetensorsHeader& a, const SafetensorsHeader& b) {
  EXPECT_EQ(a.data_start, b.data_start);
  EXPECT_EQ(a.data_bytes, b.data_bytes);
  EXPECT_EQ(a.metadata, b.metadata);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const SafetensorsTensor& t : a.tensors) {
    std::optional<size_t> k = b.find(t.name);
    ASSERT_TRUE(k.has_value()) << t.name;
    EXPECT_EQ(t.dtype, b.tensors[*k].dtype) << t.name;
    EXPECT_EQ(t.shape, b.tensors[*k].shape) << t.name;
    EXPECT_EQ(t.begin, b.tensors[*k].begin) << t.name;
    EXPECT_EQ(t.end, b.tensors[*k].end) << t.name;
  }
  // Both are in data order.
  for (const auto* h : {&a, &b}) {
    for (size_t i = 1; i < h->tensors.size(); ++i) {
      EXPECT_LE(h->tensors[i - 1].end, h->tensors[i].begin) << h->tensors[i].name;
    }
  }
}

// Encodes, appends the data section, parses the result, and checks it matches the layout.
SafetensorsHeader round_trip(const std::vector<SafetensorsEntry>& entries,
                             const std::map<std::string, std::string>& metadata,
                             uint32_t alignment) {
  SafetensorsHeader layout;
  Result<std::string> bytes = encode_safetensors_header(entries, metadata, alignment, &layout);
  EXPECT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  if (!bytes.is_ok()) return layout;
  EXPECT_EQ(bytes->size() % alignment, 0u);
  EXPECT_EQ(layout.data_start, bytes->size());
  Result<SafetensorsHeader> parsed = parse(*bytes + std::string(layout.data_bytes, '\x5a'));
  EXPECT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  if (parsed.is_ok()) expect_same(layout, *parsed);
  return layout;
}

TEST(SafetensorsTest, DtypeSizes) {
  EXPECT_EQ(safetensors_dtype_size("F32"), 4u);
  EXPECT_EQ(safetensors_dtype_size("BOOL"), 1u);
  EXPECT_EQ(safetensors_dtype_size("F8_E4M3"), 1u);
  EXPECT_EQ(safetensors_dtype_size("F8_E5M2"), 1u);
  EXPECT_EQ(safetensors_dtype_size("BF16"), 2u);
  EXPECT_EQ(safetensors_dtype_size("U16"), 2u);
  EXPECT_EQ(safetensors_dtype_size("I32"), 4u);
  EXPECT_EQ(safetensors_dtype_size("F64"), 8u);
  EXPECT_EQ(safetensors_dtype_size("U64"), 8u);
  EXPECT_EQ(safetensors_dtype_size("C64"), 8u);
  for (const char* unknown : {"", "f32", "F128", "F4", "INT4", "float32"}) {
    EXPECT_FALSE(safetensors_dtype_size(unknown).has_value()) << unknown;
  }
}

// Byte-for-byte what the reference writer (safetensors' Rust tests) produces, so files written
// with 8-byte alignment are indistinguishable from theirs.
TEST(SafetensorsTest, MatchesReferenceWriterBytes) {
  struct Case {
    std::vector<SafetensorsEntry> entries;
    std::map<std::string, std::string> metadata;
    std::string json;
    uint64_t n;
  };
  const std::vector<Case> cases = {
      {{{"attn.0", "F32", {1, 2, 3}}},
       {},
       R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})",
       64},
      {{{"attn0", "F32", {1, 1, 2, 3}}},
       {},
       R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}})",
       72},
      {{}, {}, "{}", 8},
      {{}, {{"framework", "pt"}}, R"({"__metadata__":{"framework":"pt"}})", 40},
  };
  for (const Case& c : cases) {
    FP_ASSERT_OK_AND_ASSIGN(std::string bytes,
                            encode_safetensors_header(c.entries, c.metadata, 8, nullptr));
    EXPECT_EQ(bytes, le64(c.n) + c.json + std::string(c.n - c.json.size(), ' '));
  }
}

TEST(SafetensorsTest, RoundTripPageAligned) {
  const std::vector<SafetensorsEntry> entries = {
      {"layer.0.weight", "F64", {2, 3}}, {"layer.0.bias", "F32", {5}},
      {"emb", "BF16", {7, 1}},           {"mask", "BOOL", {3}},
      {"fp8", "F8_E4M3", {4}},           {"z", "C64", {2}},
  };
  SafetensorsHeader layout = round_trip(entries, {{"format", "pt"}, {"step", "12"}}, 4096);
  EXPECT_EQ(layout.data_start, 4096u);
  ASSERT_EQ(layout.tensors.size(), entries.size());
  // Data order is the given order, each tensor right after the previous one.
  uint64_t offset = 0;
  const std::vector<uint64_t> sizes = {48, 20, 14, 3, 4, 16};
  for (size_t i = 0; i < entries.size(); ++i) {
    EXPECT_EQ(layout.tensors[i].name, entries[i].name);
    EXPECT_EQ(layout.tensors[i].begin, offset);
    EXPECT_EQ(layout.tensors[i].nbytes(), sizes[i]);
    offset += sizes[i];
  }
  EXPECT_EQ(layout.data_bytes, offset);
  EXPECT_EQ(layout.file_bytes(), 4096 + offset);
  EXPECT_EQ(layout.find("emb"), 2u);
  EXPECT_FALSE(layout.find("nope").has_value());
}

TEST(SafetensorsTest, HeaderIsCompactJsonPaddedWithSpaces) {
  SafetensorsHeader layout;
  FP_ASSERT_OK_AND_ASSIGN(std::string bytes,
                          encode_safetensors_header({{"a", "F32", {2}}}, {}, 4096, &layout));
  ASSERT_EQ(bytes.size(), 4096u);
  const std::string json = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_EQ(bytes.substr(0, 8), le64(4088));
  EXPECT_EQ(bytes.substr(8, json.size()), json);
  EXPECT_EQ(bytes.find_first_not_of(' ', 8 + json.size()), std::string::npos);
  EXPECT_EQ(bytes.find("__metadata__"), std::string::npos);  // only written when non-empty
}

TEST(SafetensorsTest, AlignmentEight) {
  SafetensorsHeader layout = round_trip({{"w", "I64", {3}}, {"b", "U8", {1}}}, {}, 8);
  EXPECT_EQ(layout.data_start % 8, 0u);
  EXPECT_LT(layout.data_start, 4096u);
}

TEST(SafetensorsTest, EmptyTensorList) {
  SafetensorsHeader layout = round_trip({}, {}, 4096);
  EXPECT_TRUE(layout.tensors.empty());
  EXPECT_EQ(layout.data_bytes, 0u);
  EXPECT_EQ(layout.file_bytes(), 4096u);
  SafetensorsHeader with_metadata = round_trip({}, {{"k", "v"}}, 64);
  EXPECT_EQ(with_metadata.metadata.at("k"), "v");
}

TEST(SafetensorsTest, ScalarAndZeroSizedTensors) {
  SafetensorsHeader layout = round_trip({{"scalar", "F64", {}},
                                         {"empty_b", "F32", {0, 3}},
                                         {"empty_a", "I32", {4, 0}},
                                         {"after", "U8", {2}},
                                         {"last_empty", "U8", {0}}},
                                        {}, 4096);
  ASSERT_EQ(layout.tensors.size(), 5u);
  // The layout keeps the entries' order; a reader lists zero-sized tensors at one offset by name.
  EXPECT_EQ(layout.tensors[0].name, "scalar");
  EXPECT_EQ(layout.tensors[0].nbytes(), 8u);
  EXPECT_EQ(layout.tensors[1].name, "empty_b");
  EXPECT_EQ(layout.tensors[1].begin, 8u);
  EXPECT_EQ(layout.tensors[1].nbytes(), 0u);
  EXPECT_EQ(layout.tensors[2].name, "empty_a");
  EXPECT_EQ(layout.tensors[3].name, "after");
  EXPECT_EQ(layout.tensors[4].begin, 10u);
  EXPECT_EQ(layout.data_bytes, 10u);
  SafetensorsHeader layout2;
  FP_ASSERT_OK_AND_ASSIGN(
      std::string bytes,
      encode_safetensors_header({{"z", "U8", {0}}, {"y", "U8", {0}}}, {}, 8, &layout2));
  FP_ASSERT_OK_AND_ASSIGN(SafetensorsHeader parsed, parse(bytes));
  EXPECT_EQ(layout2.tensors[0].name, "z");
  EXPECT_EQ(parsed.tensors[0].name, "y");
}

TEST(SafetensorsTest, EncodeRejectsBadArguments) {
  const std::vector<std::vector<SafetensorsEntry>> bad = {
      {{"", "F32", {1}}},
      {{"__x", "F32", {1}}},
      {{"__metadata__", "F32", {1}}},
      {{"a", "F32", {1}}, {"a", "F16", {1}}},
      {{"a", "F128", {1}}},
      {{"a", "F32", {uint64_t{1} << 32, uint64_t{1} << 32}}},
      {{"a", "U8", {uint64_t{1} << 63}}, {"b", "U8", {uint64_t{1} << 63}}},
      {{std::string("bad\xff utf8"), "F32", {1}}},
  };
  for (const auto& entries : bad) {
    Result<std::string> r = encode_safetensors_header(entries, {}, 4096, nullptr);
    ASSERT_FALSE(r.is_ok()) << entries.back().name;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().to_string();
  }
  for (uint32_t alignment : {0u, 1u, 4u, 6u, 12u, 4097u}) {
    Result<std::string> r = encode_safetensors_header({}, {}, alignment, nullptr);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << alignment;
  }
}

TEST(SafetensorsTest, ParseAsksForMoreBytes) {
  SafetensorsHeader layout;
  FP_ASSERT_OK_AND_ASSIGN(std::string bytes,
                          encode_safetensors_header({{"a", "F32", {2}}}, {}, 4096, &layout));
  const std::string file = bytes + std::string(8, '\0');
  Result<SafetensorsHeader> r = parse_safetensors_header(file.substr(0, 8), file.size(), kPath);
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(r.status().offset(), 0u);
  EXPECT_EQ(r.status().length(), 4096u);
  r = parse_safetensors_header(file.substr(0, 4095), file.size(), kPath);
  EXPECT_EQ(r.status().length(), 4096u);
  r = parse_safetensors_header(file.substr(0, 5), file.size(), kPath);
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(r.status().length(), 8u);
  FP_EXPECT_OK(parse_safetensors_header(file.substr(0, 4096), file.size(), kPath));
  FP_EXPECT_OK(parse_safetensors_header(file, file.size(), kPath));  // data bytes are ignored
}

TEST(SafetensorsTest, ParseRejectsDamagedLengths) {
  Result<SafetensorsHeader> r = parse_safetensors_header("abc", 3, kPath);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);  // too short to hold the length
  std::string huge = le64(kSafetensorsMaxHeaderBytes + 1) + "{}";
  r = parse_safetensors_header(huge, uint64_t{1} << 40, kPath);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("100 MB"), std::string::npos);
  std::string truncated = le64(100) + "{}";  // header runs past the end of the file
  r = parse(truncated);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("past the end"), std::string::npos);
  r = parse(le64(UINT64_MAX));
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
}

TEST(SafetensorsTest, ParseRejectsBadJson) {
  expect_damaged(R"({"a":)", 0, "not valid JSON");
  expect_damaged(R"( {})", 0, "start with '{'");
  expect_damaged(R"([])", 0, "start with '{'");
  expect_damaged("{\"\xff\":1}", 0, "not valid JSON");
  expect_damaged(R"({"a":1})", 0, "tensor \"a\" is not a JSON object");
  expect_damaged(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4, "\"dtype\"");
  expect_damaged(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, "\"shape\"");
  expect_damaged(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4, "\"shape\"");
  expect_damaged(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4, "data_offsets");
  expect_damaged(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", 4, "data_offsets");
  expect_damaged(R"({"a":{"dtype":"F32","shape":[1]}})", 4, "data_offsets");
  expect_damaged(R"({"a":{"dtype":"X9","shape":[1],"data_offsets":[0,4]}})", 4, "unknown dtype");
  expect_damaged(R"({"__metadata__":[]})", 0, "__metadata__");
  expect_damaged(R"({"__metadata__":{"k":1}})", 0, "not a string");
}

TEST(SafetensorsTest, ParseRejectsDuplicateNames) {
  expect_damaged("{\"a\":" + f32("[1]", 0, 4) + ",\"a\":" + f32("[1]", 4, 8) + "}", 8,
                 "\"a\" appears twice");
  expect_damaged(
      "{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],"
      "\"data_offsets\":[0,4]}}",
      4, "appears twice");
}

TEST(SafetensorsTest, ParseRejectsBadLayouts) {
  // overlap, hole, hole at the start, end before begin, size that disagrees with the shape
  expect_damaged("{\"a\":" + f32("[2]", 0, 8) + ",\"b\":" + f32("[2]", 4, 12) + "}", 12,
                 "overlaps");
  expect_damaged("{\"a\":" + f32("[2]", 0, 8) + ",\"b\":" + f32("[1]", 12, 16) + "}", 16, "hole");
  expect_damaged("{\"a\":" + f32("[1]", 4, 8) + "}", 8, "hole");
  expect_damaged("{\"a\":" + f32("[0]", 8, 4) + "}", 8, "ends before it begins");
  expect_damaged("{\"a\":" + f32("[2]", 0, 12) + "}", 12, "needs 8");
  expect_damaged("{\"a\":" + f32("[4294967296,4294967296]", 0, 8) + "}", 8, "overflows");
}

TEST(SafetensorsTest, ParseRejectsFileSizeMismatch) {
  const std::string json = "{\"a\":" + f32("[2]", 0, 8) + "}";
  FP_EXPECT_OK(parse(raw_file(json, 8)));
  expect_damaged(json, 9, "cover 8 bytes");  // trailing garbage
  expect_damaged(json, 7, "cover 8 bytes");  // truncated data
  expect_damaged("{}", 1, "cover 0 bytes");
}

TEST(SafetensorsTest, ParseAcceptsAnyKeyOrderAndUnknownFields) {
  const std::string json = "{\"b\":" + f32("[1]", 4, 8) + ",\"a\":" + f32("[1]", 0, 4) +
                           ",\"c\":{\"data_offsets\":[8,10],\"extra\":1,\"shape\":[],"
                           "\"dtype\":\"BF16\"}}";
  FP_ASSERT_OK_AND_ASSIGN(SafetensorsHeader h, parse(raw_file(json, 10)));
  ASSERT_EQ(h.tensors.size(), 3u);
  EXPECT_EQ(h.tensors[0].name, "a");
  EXPECT_EQ(h.tensors[1].name, "b");
  EXPECT_EQ(h.tensors[2].name, "c");
  EXPECT_EQ(h.data_start, 8 + json.size());
}

TEST(SafetensorsTest, ReadsHeaderOfARealFile) {
  testing::TempDir dir;
  SafetensorsHeader layout;
  FP_ASSERT_OK_AND_ASSIGN(std::string bytes,
                          encode_safetensors_header({{"w", "F32", {64, 64}}, {"b", "F16", {64}}},
                                                    {{"framework", "pt"}}, 4096, &layout));
  std::vector<std::byte> data = testing::random_bytes(layout.data_bytes, 3);
  std::string file = bytes + std::string(reinterpret_cast<const char*>(data.data()), data.size());
  const std::string path = dir.file("t.safetensors");
  FP_ASSERT_OK(testing::write_whole_file(path, std::as_bytes(std::span(file))));
  FP_ASSERT_OK_AND_ASSIGN(SafetensorsHeader read, read_safetensors_header(path));
  expect_same(layout, read);

  // Truncated on disk: damage, naming the file.
  FP_ASSERT_OK(testing::write_whole_file(path, std::as_bytes(std::span(file).first(5000))));
  Result<SafetensorsHeader> r = read_safetensors_header(path);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(r.status().path(), path);
  FP_ASSERT_OK(testing::write_whole_file(path, std::as_bytes(std::span(file).first(3))));
  EXPECT_EQ(read_safetensors_header(path).status().code(), StatusCode::kDataLoss);
  FP_ASSERT_OK(testing::write_whole_file(path, std::as_bytes(std::span(file).first(100))));
  EXPECT_EQ(read_safetensors_header(path).status().code(), StatusCode::kDataLoss);
}

TEST(SafetensorsTest, ReadReportsOsErrors) {
  testing::TempDir dir;
  Result<SafetensorsHeader> r = read_safetensors_header(dir.file("missing.safetensors"));
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(r.status().sys_errno(), ENOENT);
  EXPECT_EQ(r.status().path(), dir.file("missing.safetensors"));
  EXPECT_EQ(read_safetensors_header(dir.path()).status().code(), StatusCode::kInvalidArgument);
}

// The one layout rule of a writer: widest element first, the caller's order among equals.
TEST(WidestFirstOrder, WidestElementFirstThenAsGiven) {
  std::vector<SafetensorsEntry> entries = {{"a", "U8", {3}}, {"b", "F32", {2}}, {"c", "BF16", {1}},
                                           {"d", "F64", {}}, {"e", "I32", {4}}, {"f", "BOOL", {1}}};
  EXPECT_EQ(widest_first_order(entries), (std::vector<size_t>{3, 1, 4, 2, 0, 5}));
  EXPECT_TRUE(widest_first_order({}).empty());
  // Every tensor then starts at a multiple of its width in the encoded layout.
  std::vector<SafetensorsEntry> laid_out;
  for (size_t k : widest_first_order(entries)) laid_out.push_back(entries[k]);
  SafetensorsHeader layout;
  ASSERT_TRUE(
      encode_safetensors_header(laid_out, {}, kSafetensorsDefaultAlignment, &layout).is_ok());
  for (const SafetensorsTensor& t : layout.tensors)
    EXPECT_EQ(t.begin % *safetensors_dtype_size(t.dtype), 0u) << t.name;
}

}  // namespace
}  // namespace fastpersist
