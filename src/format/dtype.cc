// SPDX-License-Identifier: Apache-2.0
// See dtype.h. The float formats are converted with integer arithmetic on their bits rather than
// with the compiler's _Float16 / __bf16, whose availability and rounding of doubles vary by
// target: torch converts doubles to the 16-bit formats through float32, and so does this file.
#include "fastpersist/dtype.h"

#include <array>
#include <bit>
#include <cstring>
#include <string>
#include <type_traits>

namespace fastpersist {
namespace {

// Never reordered (see dtype.h). Torch names left empty: checkpoints do not store that dtype
// (complex tensors go to the pickled sidecar; torch's E8M0 is too new to rely on).
constexpr std::array<DtypeInfo, 17> kDtypes = {{
    {"F64", "float64", 8, DtypeKind::kFloat},
    {"F32", "float32", 4, DtypeKind::kFloat},
    {"F16", "float16", 2, DtypeKind::kFloat},
    {"BF16", "bfloat16", 2, DtypeKind::kFloat},
    {"I64", "int64", 8, DtypeKind::kSigned},
    {"I32", "int32", 4, DtypeKind::kSigned},
    {"I16", "int16", 2, DtypeKind::kSigned},
    {"I8", "int8", 1, DtypeKind::kSigned},
    {"U8", "uint8", 1, DtypeKind::kUnsigned},
    {"BOOL", "bool", 1, DtypeKind::kBool},
    {"U16", "uint16", 2, DtypeKind::kUnsigned},
    {"U32", "uint32", 4, DtypeKind::kUnsigned},
    {"U64", "uint64", 8, DtypeKind::kUnsigned},
    {"F8_E4M3", "float8_e4m3fn", 1, DtypeKind::kFloat},
    {"F8_E5M2", "float8_e5m2", 1, DtypeKind::kFloat},
    {"F8_E8M0", "", 1, DtypeKind::kFloat},
    {"C64", "", 8, DtypeKind::kComplex},
}};

struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};
// The 8-bit floats are read (widened to float), never written: torch's rounding into them
// saturates differently per format and is not needed by a load.
struct Float8E4M3 {
  uint8_t bits;
};
struct Float8E5M2 {
  uint8_t bits;
};

float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t{h & 0x8000u} << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24 is exact in float.
    float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

uint16_t float_to_half(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return sign | 0x7e00u;   // NaN: the quiet NaN, sign kept
  if (x >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to infinity
  if (x < 0x38800000u) {
    // Below the smallest normal half: adding 0.5 lines the half's subnormal ulp (2^-24) up
    // with float's ulp at 0.5, so the FPU's own round-to-nearest-even does the rounding.
    float shifted = std::bit_cast<float>(x) + 0.5f;
    return sign | static_cast<uint16_t>(std::bit_cast<uint32_t>(shifted) - 0x3f000000u);
  }
  uint32_t odd = (x >> 13) & 1u;
  // Rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest, ties to even; a
  // carry out of the mantissa correctly bumps the exponent.
  x += 0xc8000fffu + odd;
  return sign | static_cast<uint16_t>(x >> 13);
}

// E4M3 "fn": bias 7, no infinities, S.1111.111 is NaN (torch widens it to 0x7ff00000).
float float8_e4m3_to_float(uint8_t b) {
  uint32_t sign = uint32_t{b & 0x80u} << 24;
  uint32_t exponent = (b >> 3) & 0xfu;
  uint32_t mantissa = b & 0x7u;
  if (exponent == 0xf && mantissa == 0x7) return std::bit_cast<float>(sign | 0x7ff00000u);
  if (exponent == 0) {
    float magnitude = static_cast<float>(mantissa) * 0x1p-9f;
    return sign != 0 ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 120) << 23) | (mantissa << 20));
}

// E5M2 is the top byte of an IEEE half.
float float8_e5m2_to_float(uint8_t b) { return half_to_float(static_cast<uint16_t>(b << 8)); }

float bfloat16_to_float(uint16_t b) { return std::bit_cast<float>(uint32_t{b} << 16); }

// `nan`: the pattern a NaN becomes. torch's own choice varies: its float32 kernel writes
// 0xffff, its scalar conversion (other sources, short tails) 0x7fc0.
uint16_t float_to_bfloat16(float f, uint16_t nan) {
  if (f != f) return nan;
  uint32_t x = std::bit_cast<uint32_t>(f);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

// The value an element converts through: 16-bit floats widen to float, everything else is
// itself.
inline float widen(Half v) { return half_to_float(v.bits); }
inline float widen(BFloat16 v) { return bfloat16_to_float(v.bits); }
inline float widen(Float8E4M3 v) { return float8_e4m3_to_float(v.bits); }
inline float widen(Float8E5M2 v) { return float8_e5m2_to_float(v.bits); }
template <typename T>
inline T widen(T v) {
  return v;
}

template <typename From, typename To>
inline To cast_value(From v) {
  if constexpr (std::is_same_v<To, Half>) {
    return Half{float_to_half(static_cast<float>(widen(v)))};
  } else if constexpr (std::is_same_v<To, BFloat16>) {
    constexpr uint16_t kNan = std::is_same_v<From, float> ? 0xffffu : 0x7fc0u;
    return BFloat16{float_to_bfloat16(static_cast<float>(widen(v)), kNan)};
  } else {
    return static_cast<To>(widen(v));
  }
}

template <typename From, typename To>
void convert_loop(const std::byte* src, std::byte* dst, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    From v;
    std::memcpy(&v, src + i * sizeof(From), sizeof(From));
    To out = cast_value<From, To>(v);
    std::memcpy(dst + i * sizeof(To), &out, sizeof(To));
  }
}

using Converter = void (*)(const std::byte*, std::byte*, size_t);

// The element types convert_elements() handles, by safetensors name.
template <typename T>
struct Tag {
  using type = T;
};

template <typename F>
bool with_type(std::string_view name, F&& fn) {
  if (name == "F64") return fn(Tag<double>{}), true;
  if (name == "F32") return fn(Tag<float>{}), true;
  if (name == "F16") return fn(Tag<Half>{}), true;
  if (name == "BF16") return fn(Tag<BFloat16>{}), true;
  if (name == "I64") return fn(Tag<int64_t>{}), true;
  if (name == "I32") return fn(Tag<int32_t>{}), true;
  if (name == "I16") return fn(Tag<int16_t>{}), true;
  if (name == "I8") return fn(Tag<int8_t>{}), true;
  if (name == "U64") return fn(Tag<uint64_t>{}), true;
  if (name == "U32") return fn(Tag<uint32_t>{}), true;
  if (name == "U16") return fn(Tag<uint16_t>{}), true;
  if (name == "U8") return fn(Tag<uint8_t>{}), true;
  if (name == "F8_E4M3") return fn(Tag<Float8E4M3>{}), true;
  if (name == "F8_E5M2") return fn(Tag<Float8E5M2>{}), true;
  return false;
}

template <typename T>
constexpr bool kIsFloat8 = std::is_same_v<T, Float8E4M3> || std::is_same_v<T, Float8E5M2>;
template <typename T>
constexpr bool kIsFloat = std::is_floating_point_v<T> || std::is_same_v<T, Half> ||
                          std::is_same_v<T, BFloat16> || kIsFloat8<T>;

Converter find_converter(std::string_view from, std::string_view to) {
  Converter found = nullptr;
  with_type(from, [&](auto from_tag) {
    using From = typename decltype(from_tag)::type;
    with_type(to, [&](auto to_tag) {
      using To = typename decltype(to_tag)::type;
      // Floats to integers: out-of-range values are undefined in torch (see dtype.h).
      if constexpr (!(kIsFloat<From> && !kIsFloat<To>)&&!kIsFloat8<To>)
        found = &convert_loop<From, To>;
    });
  });
  return found;
}

}  // namespace

std::span<const DtypeInfo> dtype_table() { return kDtypes; }

const DtypeInfo* find_dtype(std::string_view name) {
  for (const DtypeInfo& d : kDtypes) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

bool conversion_supported(std::string_view from, std::string_view to) {
  if (from == to) return find_dtype(from) != nullptr;
  return find_converter(from, to) != nullptr;
}

Status convert_elements(std::string_view from, const std::byte* src, std::string_view to,
                        std::byte* dst, size_t count) {
  const DtypeInfo* info = find_dtype(from);
  if (info == nullptr || find_dtype(to) == nullptr) {
    return Status(StatusCode::kInvalidArgument,
                  "unknown dtype '" + std::string(info == nullptr ? from : to) + "'");
  }
  if (from == to) {
    if (count > 0) std::memcpy(dst, src, count * info->size);
    return Status::ok();
  }
  Converter convert = find_converter(from, to);
  if (convert == nullptr) {
    return Status(StatusCode::kInvalidArgument,
                  "cannot convert " + std::string(from) + " to " + std::string(to) +
                      ": supported are conversions among F64, F32, F16 and BF16, from the 8-bit "
                      "floats and from integers to those, and between integers");
  }
  convert(src, dst, count);
  return Status::ok();
}

}  // namespace fastpersist
