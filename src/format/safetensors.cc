// SPDX-License-Identifier: Apache-2.0
// The safetensors header: layout and encoding for writers; parsing with the reference reader's
// validation for readers. Anything a reader rejects is kDataLoss: the file is damaged or is not
// what it claims to be.
#include "fastpersist/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <tuple>

#include "common/align.h"
#include "common/regular_file.h"
#include "common/unique_fd.h"
#include "fastpersist/dtype.h"
#include "format/format_internal.h"

namespace fastpersist {
namespace {

using Json = nlohmann::json;  // keys sorted: parsing a header with many tensors stays n log n
using format_internal::tensor_nbytes;

Status damaged(const std::string& problem, const std::string& path) {
  return Status(StatusCode::kDataLoss, "bad safetensors header: " + problem).with_path(path);
}

Status bad_entry(const std::string& problem) {
  return Status(StatusCode::kInvalidArgument, "cannot encode safetensors header: " + problem);
}

uint64_t load_le64(const char* p) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(p[i]);
  return value;
}

void store_le64(uint64_t value, char* p) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

std::string shape_text(const std::vector<uint64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? "," : "") + std::to_string(shape[i]);
  return text + "]";
}

// Data order; ties (zero-sized tensors at one offset) by name, so every reader of one file lists
// its tensors in the same order, whatever order the JSON had.
bool data_order(const SafetensorsTensor& a, const SafetensorsTensor& b) {
  return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
}

bool is_u64(const Json& j) { return j.is_number_unsigned(); }

Result<SafetensorsTensor> parse_tensor(const std::string& name, const Json& j,
                                       const std::string& path) {
  const std::string where = "tensor \"" + name + "\"";
  if (!j.is_object()) return damaged(where + " is not a JSON object", path);
  SafetensorsTensor t;
  t.name = name;
  auto dtype = j.find("dtype");
  if (dtype == j.end() || !dtype->is_string()) {
    return damaged(where + ": \"dtype\" is missing or not a string", path);
  }
  t.dtype = dtype->get<std::string>();
  if (!safetensors_dtype_size(t.dtype)) {
    return damaged(where + ": unknown dtype \"" + t.dtype + "\"", path);
  }
  auto shape = j.find("shape");
  if (shape == j.end() || !shape->is_array() ||
      !std::all_of(shape->begin(), shape->end(), is_u64)) {
    return damaged(where + ": \"shape\" is missing or not a list of non-negative integers", path);
  }
  for (const Json& dim : *shape) t.shape.push_back(dim.get<uint64_t>());
  auto offsets = j.find("data_offsets");
  if (offsets == j.end() || !offsets->is_array() || offsets->size() != 2 ||
      !is_u64((*offsets)[0]) || !is_u64((*offsets)[1])) {
    return damaged(where + ": \"data_offsets\" is missing or not [begin, end]", path);
  }
  t.begin = (*offsets)[0].get<uint64_t>();
  t.end = (*offsets)[1].get<uint64_t>();
  return t;
}

// The reference reader's rules: the tensors, in data order, tile [0, data_bytes) exactly.
Status check_layout(const std::vector<SafetensorsTensor>& tensors, uint64_t data_bytes,
                    const std::string& path) {
  uint64_t cursor = 0;
  for (const SafetensorsTensor& t : tensors) {
    const std::string where = "tensor \"" + t.name + "\"";
    if (t.end < t.begin) return damaged(where + " ends before it begins", path);
    if (t.begin < cursor) return damaged(where + " overlaps the tensor before it", path);
    if (t.begin > cursor) {
      return damaged("bytes [" + std::to_string(cursor) + ", " + std::to_string(t.begin) +
                         ") of the data belong to no tensor (hole before " + where + ")",
                     path);
    }
    auto need = tensor_nbytes(t.shape, *safetensors_dtype_size(t.dtype));
    if (!need) return damaged(where + ": shape " + shape_text(t.shape) + " overflows", path);
    if (t.nbytes() != *need) {
      return damaged(where + " holds " + std::to_string(t.nbytes()) + " bytes but " + t.dtype +
                         " " + shape_text(t.shape) + " needs " + std::to_string(*need),
                     path);
    }
    cursor = t.end;
  }
  if (cursor != data_bytes) {
    return damaged("the tensors cover " + std::to_string(cursor) +
                       " bytes of data but the file holds " + std::to_string(data_bytes) +
                       " after the header",
                   path);
  }
  return Status::ok();
}

}  // namespace

// The one dtype table (fastpersist/dtype.h): every whole-byte dtype safetensors defines. The
// sub-byte F4/F6 types are left out: their byte sizes are not product(shape) * size.
std::optional<size_t> safetensors_dtype_size(std::string_view dtype) {
  const DtypeInfo* info = find_dtype(dtype);
  if (info == nullptr) return std::nullopt;
  return info->size;
}

std::optional<size_t> SafetensorsHeader::find(std::string_view name) const {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].name == name) return i;
  }
  return std::nullopt;
}

std::vector<size_t> widest_first_order(const std::vector<SafetensorsEntry>& entries) {
  std::vector<size_t> width(entries.size());
  for (size_t i = 0; i < entries.size(); ++i)
    width[i] = safetensors_dtype_size(entries[i].dtype).value_or(1);
  std::vector<size_t> order(entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return width[a] > width[b]; });
  return order;
}

Result<std::string> encode_safetensors_header(const std::vector<SafetensorsEntry>& entries,
                                              const std::map<std::string, std::string>& metadata,
                                              uint32_t alignment, SafetensorsHeader* layout) {
  if (alignment < 8 || !is_power_of_two(alignment)) {
    return bad_entry("alignment " + std::to_string(alignment) + " is not a power of two >= 8");
  }
  SafetensorsHeader out;
  out.metadata = metadata;
  std::set<std::string_view> names;
  // Built piece by piece: a JSON object type would reorder or slow down many keys, and the
  // format lets the header list tensors in any order.
  std::string json = "{";
  auto dump = [](const auto& value) {
    return value.dump(-1, ' ', false, Json::error_handler_t::strict);
  };
  try {
    if (!metadata.empty()) json += "\"__metadata__\":" + dump(Json(metadata));
    for (const SafetensorsEntry& e : entries) {
      if (e.name.empty()) return bad_entry("a tensor has an empty name");
      if (e.name.rfind("__", 0) == 0) {
        return bad_entry("tensor name \"" + e.name + "\" starts with \"__\" (reserved)");
      }
      if (!names.insert(e.name).second) return bad_entry("tensor \"" + e.name + "\" twice");
      auto size = safetensors_dtype_size(e.dtype);
      if (!size) return bad_entry("tensor \"" + e.name + "\": unknown dtype \"" + e.dtype + "\"");
      auto nbytes = tensor_nbytes(e.shape, *size);
      if (!nbytes || *nbytes > std::numeric_limits<uint64_t>::max() - out.data_bytes) {
        return bad_entry("tensor \"" + e.name + "\": size overflows 64 bits");
      }
      SafetensorsTensor t{e.name, e.dtype, e.shape, out.data_bytes, out.data_bytes + *nbytes};
      // Field order as the reference writer's, so 8-aligned headers match its bytes exactly.
      nlohmann::ordered_json info = {
          {"dtype", e.dtype},
          {"shape", e.shape},
          {"data_offsets", nlohmann::ordered_json::array({t.begin, t.end})}};
      if (json.size() > 1) json += ',';
      json += dump(Json(e.name)) + ":" + dump(info);
      out.data_bytes = t.end;
      out.tensors.push_back(std::move(t));
    }
  } catch (const nlohmann::json::exception&) {
    return bad_entry("a tensor name or metadata string is not valid UTF-8");
  }
  json += '}';
  const uint64_t total = align_up(8 + json.size(), alignment);
  const uint64_t n = total - 8;
  if (n > kSafetensorsMaxHeaderBytes) {
    return bad_entry("header of " + std::to_string(n) + " bytes exceeds the format's limit");
  }
  std::string bytes(static_cast<size_t>(total), ' ');  // the padding is spaces
  store_le64(n, bytes.data());
  std::memcpy(bytes.data() + 8, json.data(), json.size());
  if (layout != nullptr) {
    out.data_start = total;
    *layout = std::move(out);
  }
  return bytes;
}

Result<std::string> pad_safetensors_header(std::string header, uint64_t bytes) {
  if (header.size() < 8 || header.size() > bytes || bytes - 8 > kSafetensorsMaxHeaderBytes) {
    return bad_entry("the header takes " + std::to_string(header.size()) +
                     " bytes, more than the " + std::to_string(bytes) + " reserved for it");
  }
  header.resize(static_cast<size_t>(bytes), ' ');
  store_le64(bytes - 8, header.data());
  return header;
}

Result<SafetensorsHeader> parse_safetensors_header(std::string_view prefix, uint64_t file_bytes,
                                                   const std::string& path) {
  if (file_bytes < 8) {
    return damaged("file of " + std::to_string(file_bytes) + " bytes has no 8-byte length", path);
  }
  if (prefix.size() < 8) {
    return Status(StatusCode::kOutOfRange, "need the first 8 bytes")
        .with_path(path)
        .with_range(0, 8);
  }
  const uint64_t n = load_le64(prefix.data());
  if (n > kSafetensorsMaxHeaderBytes) {
    return damaged("header length " + std::to_string(n) + " exceeds the 100 MB limit", path);
  }
  if (8 + n > file_bytes) {
    return damaged("header length " + std::to_string(n) + " runs past the end of the " +
                       std::to_string(file_bytes) + "-byte file",
                   path);
  }
  if (prefix.size() < 8 + n) {
    return Status(StatusCode::kOutOfRange,
                  "need the first " + std::to_string(8 + n) + " bytes to parse the header")
        .with_path(path)
        .with_range(0, 8 + n);
  }
  const std::string_view text = prefix.substr(8, static_cast<size_t>(n));
  // The reference reader (since 0.4) insists on '{' first: no leading whitespace or BOM.
  if (text.empty() || text.front() != '{') return damaged("does not start with '{'", path);
  std::string why;
  std::optional<Json> json = format_internal::parse_json_strict<Json>(text, &why);
  if (!json) return damaged(why, path);
  if (!json->is_object()) return damaged("is not a JSON object", path);

  SafetensorsHeader header;
  header.data_start = 8 + n;
  header.data_bytes = file_bytes - header.data_start;
  for (const auto& [key, value] : json->items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) return damaged("\"__metadata__\" is not an object", path);
      for (const auto& [mkey, mvalue] : value.items()) {
        if (!mvalue.is_string()) {
          return damaged("\"__metadata__\" value of \"" + mkey + "\" is not a string", path);
        }
        header.metadata.emplace(mkey, mvalue.get<std::string>());
      }
      continue;
    }
    FP_ASSIGN_OR_RETURN(SafetensorsTensor tensor, parse_tensor(key, value, path));
    header.tensors.push_back(std::move(tensor));
  }
  std::sort(header.tensors.begin(), header.tensors.end(), data_order);
  FP_RETURN_IF_ERROR(check_layout(header.tensors, header.data_bytes, path));
  return header;
}

Result<SafetensorsHeader> read_safetensors_header(const std::string& path) {
  Result<RegularFile> file = open_regular_file(path, Symlinks::kFollow, "the safetensors file");
  if (!file.is_ok()) {
    // Not a plain file is the caller's mistake here (a path a user named), not damage.
    const Status& st = file.status();
    return st.code() == StatusCode::kDataLoss
               ? Status(StatusCode::kInvalidArgument, st.message()).with_path(path)
               : st;
  }
  const UniqueFd& fd = file->fd;
  const uint64_t file_bytes = file->size;
  std::string prefix(static_cast<size_t>(std::min<uint64_t>(file_bytes, 8)), '\0');
  FP_RETURN_IF_ERROR(format_internal::pread_exact(fd.get(), prefix.data(), prefix.size(), 0, path));
  Result<SafetensorsHeader> header = parse_safetensors_header(prefix, file_bytes, path);
  if (header.is_ok() || header.status().code() != StatusCode::kOutOfRange) return header;
  // parse checked that 8 + N fits in the file (and N in the 100 MB limit) before asking.
  const uint64_t need = header.status().length().value_or(8);
  prefix.resize(static_cast<size_t>(need));
  FP_RETURN_IF_ERROR(format_internal::pread_exact(fd.get(), prefix.data() + 8, need - 8, 8, path));
  return parse_safetensors_header(prefix, file_bytes, path);
}

}  // namespace fastpersist
