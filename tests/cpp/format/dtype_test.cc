// SPDX-License-Identifier: Apache-2.0
// The dtype table and element conversions. Bit-identity with torch's `.to()` on random data is
// tested against real torch in tests/python/test_checkpoint_load_dtype.py; here the edge cases
// have hand-checked bit patterns.
#include "fastpersist/dtype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <limits>
#include <set>
#include <vector>

#include "fastpersist/safetensors.h"

namespace fastpersist {
namespace {

template <typename From, typename To>
std::vector<To> convert(std::string_view from, std::string_view to, const std::vector<From>& in) {
  std::vector<To> out(in.size());
  Status st = convert_elements(from, reinterpret_cast<const std::byte*>(in.data()), to,
                               reinterpret_cast<std::byte*>(out.data()), in.size());
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return out;
}

TEST(DtypeTable, AgreesWithTheSafetensorsSizesAndHasUniqueNames) {
  std::set<std::string_view> names;
  std::set<std::string_view> torch_names;
  for (const DtypeInfo& d : dtype_table()) {
    EXPECT_TRUE(names.insert(d.name).second) << d.name;
    if (!d.torch_name.empty()) {
      EXPECT_TRUE(torch_names.insert(d.torch_name).second) << d.torch_name;
    }
    EXPECT_EQ(safetensors_dtype_size(d.name), std::optional<size_t>(d.size)) << d.name;
    EXPECT_EQ(find_dtype(d.name), &d);
  }
  EXPECT_EQ(find_dtype("F4"), nullptr);
  EXPECT_EQ(find_dtype("f32"), nullptr) << "names are case-sensitive, as in safetensors";
}

TEST(DtypeConversion, FloatToHalfRoundsToNearestEvenWithSubnormalsOverflowAndNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> in = {0.0f,
                           -0.0f,
                           1.0f,
                           -2.5f,
                           65504.0f,
                           65519.99f,
                           65520.0f,
                           1e10f,
                           -inf,
                           nan,
                           0x1p-24f,            // smallest subnormal half
                           0x1p-25f,            // halfway to it: ties to even (0)
                           0x1.8p-25f,          // above halfway: rounds up
                           0x1.ff8p-15f,        // largest subnormal half
                           1.0f + 0x1p-11f,     // tie between 1 and 1+2^-10: even (1)
                           1.0f + 0x1.8p-11f};  // rounds up
  std::vector<uint16_t> want = {0x0000, 0x8000, 0x3c00, 0xc100, 0x7bff, 0x7bff, 0x7c00, 0x7c00,
                                0xfc00, 0x7e00, 0x0001, 0x0000, 0x0001, 0x03ff, 0x3c00, 0x3c01};
  EXPECT_EQ((convert<float, uint16_t>("F32", "F16", in)), want);
}

TEST(DtypeConversion, FloatToBfloat16RoundsToNearestEvenAndCanonicalisesNan) {
  std::vector<float> in = {1.0f,
                           std::bit_cast<float>(0x3f808000u),
                           std::bit_cast<float>(0x3f818000u),
                           std::bit_cast<float>(0x3f808001u),
                           -std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::max(),
                           0x1p-130f};
  // 1.0; tie to even (down); tie to even (up); above the tie; NaN (torch's float kernel gives
  // 0xffff whatever the sign); FLT_MAX rounds to infinity; a subnormal keeps its top bits.
  std::vector<uint16_t> want = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0xffff, 0x7f80, 0x0008};
  EXPECT_EQ((convert<float, uint16_t>("F32", "BF16", in)), want);
  // From a half, torch converts NaN with its scalar routine: 0x7fc0.
  EXPECT_EQ((convert<uint16_t, uint16_t>("F16", "BF16", {0x7e00, 0xfe00})),
            (std::vector<uint16_t>{0x7fc0, 0x7fc0}));
}

TEST(DtypeConversion, HalfAndBfloat16WidenExactly) {
  std::vector<uint16_t> half = {0x0001, 0x03ff, 0x3c00, 0x7c00, 0xfc00, 0x8000, 0x7bff};
  std::vector<float> want = {0x1p-24f,
                             0x1.ff8p-15f,
                             1.0f,
                             std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity(),
                             -0.0f,
                             65504.0f};
  std::vector<float> got = convert<uint16_t, float>("F16", "F32", half);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i])) << i;
  }
  std::vector<double> wide = convert<uint16_t, double>("BF16", "F64", {0x3f80, 0xc0a0});
  EXPECT_EQ(wide, (std::vector<double>{1.0, -5.0}));
}

TEST(DtypeConversion, EightBitFloatsWidenExactly) {
  // E4M3: 1.0, -448 (largest), 2^-9 (smallest subnormal), NaN; E5M2: 1.0, inf, 2^-16.
  std::vector<float> e4m3 = convert<uint8_t, float>("F8_E4M3", "F32", {0x38, 0xfe, 0x01, 0x7f});
  EXPECT_EQ(e4m3[0], 1.0f);
  EXPECT_EQ(e4m3[1], -448.0f);
  EXPECT_EQ(e4m3[2], 0x1p-9f);
  EXPECT_EQ(std::bit_cast<uint32_t>(e4m3[3]), 0x7ff00000u);
  std::vector<float> e5m2 = convert<uint8_t, float>("F8_E5M2", "F32", {0x3c, 0x7c, 0x01});
  EXPECT_EQ(e5m2, (std::vector<float>{1.0f, std::numeric_limits<float>::infinity(), 0x1p-16f}));
}

TEST(DtypeConversion, IntegersWrapAndConvertToFloats) {
  EXPECT_EQ((convert<int64_t, int8_t>("I64", "I8", {300, -129, 127})),
            (std::vector<int8_t>{44, 127, 127}));
  EXPECT_EQ((convert<int32_t, uint8_t>("I32", "U8", {-1, 256})), (std::vector<uint8_t>{255, 0}));
  EXPECT_EQ((convert<int64_t, float>("I64", "F32", {16777217, -3})),
            (std::vector<float>{16777216.0f, -3.0f}));
  EXPECT_EQ((convert<uint8_t, uint16_t>("U8", "F16", {255})), (std::vector<uint16_t>{0x5bf8}));
}

TEST(DtypeConversion, UnsupportedPairsAreAClearErrorAndWriteNothing) {
  float in[2] = {1.5f, 2.5f};
  int32_t out[2] = {7, 7};
  Status st = convert_elements("F32", reinterpret_cast<const std::byte*>(in), "I32",
                               reinterpret_cast<std::byte*>(out), 2);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("cannot convert F32 to I32"), std::string::npos) << st.to_string();
  EXPECT_EQ(out[0], 7);
  EXPECT_FALSE(conversion_supported("BOOL", "F32"));
  EXPECT_FALSE(conversion_supported("F32", "F8_E4M3"));
  EXPECT_FALSE(conversion_supported("F8_E4M3", "I32"));
  EXPECT_TRUE(conversion_supported("F8_E4M3", "F8_E4M3"));
  EXPECT_TRUE(conversion_supported("BF16", "F16"));
  EXPECT_EQ(convert_elements("F33", nullptr, "F32", nullptr, 0).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fastpersist
