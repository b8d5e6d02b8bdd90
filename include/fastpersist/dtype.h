// SPDX-License-Identifier: Apache-2.0
// The one table of tensor element types: safetensors names, torch names, element sizes and
// kinds, and the element conversions a load applies (`dtype=` of a load, or a destination of
// another dtype). Python derives its torch <-> safetensors mapping from this table
// (`_core.dtype_table()`), so the two languages cannot disagree.
//
// Conversions give the bits torch's `Tensor.to()` gives on the CPU: floats round to nearest,
// ties to even, through float32 for the 16-bit formats (as c10::Half / c10::BFloat16 do);
// NaN stays NaN, overflow becomes infinity, subnormals are kept. A NaN's bits follow torch
// where torch is consistent: F32 -> BF16 gives 0xFFFF (torch's float kernel), other sources
// 0x7FC0 (torch's scalar conversion; its F64 kernel mixes both by position).
// The 8-bit floats (F8_E4M3, F8_E5M2) widen exactly to the other floats; nothing converts into
// them. Integers convert to floats by rounding to nearest and to other integers by keeping the
// low bits (two's complement), as C++'s static_cast does. Floats to integers are refused: torch
// leaves out-of-range values undefined, so no answer could be bit-identical.
//
// Thread-safety: pure functions over a constant table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "fastpersist/status.h"

namespace fastpersist {

enum class DtypeKind : uint8_t {
  kFloat,     // F64 F32 F16 BF16 and the 8-bit floats (F8_*)
  kSigned,    // I8 I16 I32 I64
  kUnsigned,  // U8 U16 U32 U64
  kBool,
  kComplex,
};

struct DtypeInfo {
  std::string_view name;        // safetensors name: "F32"
  std::string_view torch_name;  // attribute of the torch module: "float32" ("" when torch has none)
  size_t size = 0;              // bytes per element
  DtypeKind kind = DtypeKind::kFloat;
};

// Every whole-byte dtype safetensors defines, in a fixed order (never reordered: Python keeps
// the order for its own tables).
std::span<const DtypeInfo> dtype_table();

// The entry of a safetensors dtype name, or nullptr.
const DtypeInfo* find_dtype(std::string_view name);

// Whether convert_elements() converts `from` into `to` (true for from == to).
bool conversion_supported(std::string_view from, std::string_view to);

// Converts `count` elements of dtype `from` at `src` into dtype `to` at `dst` (neither needs
// any alignment; the ranges must not overlap). kInvalidArgument names the pair when it is not
// supported or a name is unknown; nothing is written then.
Status convert_elements(std::string_view from, const std::byte* src, std::string_view to,
                        std::byte* dst, size_t count);

}  // namespace fastpersist
