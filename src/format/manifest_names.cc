// SPDX-License-Identifier: Apache-2.0
// Which names a manifest may hold. A name becomes a path under the root, so these rules are
// what keeps a damaged or hostile manifest from reaching outside it.
#include "format/manifest_names.h"

#include "common/printable.h"
#include "fastpersist/manifest.h"
#include "fastpersist/tensor_codec.h"

namespace fastpersist {
namespace format_internal {

std::string plain_file_name_problem(std::string_view name) {
  if (name.empty()) return "is empty";
  if (name == "." || name == "..") return "is \"" + std::string(name) + "\", not a file name";
  if (name.find('/') != std::string_view::npos) return "holds a '/'";
  if (name.find('\0') != std::string_view::npos) return "holds a NUL byte";
  return "";
}

std::string file_name_problem(std::string_view name, std::string_view own_tag) {
  size_t slash = name.find('/');
  if (slash == std::string_view::npos) return plain_file_name_problem(name);
  // A reference: "<tag>/<plain name>". The tag rule excludes "", ".", ".." and hidden names,
  // and the plain-name rule excludes a second '/', so there is no way up or out.
  std::string_view tag = name.substr(0, slash);
  std::string_view file = name.substr(slash + 1);
  if (Status st = check_tag_syntax(tag); !st.is_ok()) {
    return "refers to another checkpoint by a name that is not a valid tag: " + st.message();
  }
  if (tag == own_tag) return "refers to its own checkpoint (\"" + std::string(tag) + "\")";
  if (std::string problem = plain_file_name_problem(file); !problem.empty()) {
    return "refers to \"" + printable(std::string(file)) + "\" in checkpoint \"" +
           std::string(tag) + "\", which " + problem;
  }
  return "";
}

bool is_encoding_name(std::string_view name) {
  constexpr size_t kMaxEncodingName = 64;
  if (name.empty() || name.size() > kMaxEncodingName) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace format_internal

Status check_tag_syntax(std::string_view tag) {
  constexpr size_t kMaxTagLength = 200;
  const std::string quoted = "checkpoint tag '" + printable(std::string(tag)) + "'";
  if (tag.empty()) return {StatusCode::kInvalidArgument, "checkpoint tag is empty"};
  if (tag.size() > kMaxTagLength) {
    return {StatusCode::kInvalidArgument,
            "checkpoint tag is longer than " + std::to_string(kMaxTagLength) + " characters"};
  }
  if (tag[0] == '.') {
    return {StatusCode::kInvalidArgument,
            quoted + " starts with '.' (reserved for temporary directories)"};
  }
  if (tag == kLatestFileName) {
    return {StatusCode::kInvalidArgument,
            "checkpoint tag 'latest' is reserved for the pointer to the newest checkpoint"};
  }
  for (char c : tag) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) {
      return {StatusCode::kInvalidArgument, quoted + " has a character outside [A-Za-z0-9._-]"};
    }
  }
  return Status::ok();
}

Status check_encoding_supported(const ManifestTensor& tensor) {
  if (compression_of_encoding(tensor.encoding).has_value()) return Status::ok();
  // A delta needs its base (decode_manifest refuses one without it).
  if (tensor.encoding == kEncodingXorZstd && tensor.delta_base) return Status::ok();
  return Status(
      StatusCode::kUnavailable,
      "tensor '" + printable(tensor.name) + "': encoding \"" + printable(tensor.encoding) +
          "\" is not supported by this fastpersist (it reads: " + std::string(kEncodingRaw) + ", " +
          std::string(kEncodingZstd) + ", " + std::string(kEncodingLz4) + ", " +
          std::string(kEncodingXorZstd) + "); a newer fastpersist wrote this checkpoint");
}

}  // namespace fastpersist
