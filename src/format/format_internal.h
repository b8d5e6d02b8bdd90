// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the format layer (private to src/format/): strict JSON parsing, tensor byte
// sizes without overflow, and exact reads with plain POSIX calls.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "common/printable.h"
#include "fastpersist/status.h"

namespace fastpersist::format_internal {

// nlohmann's DOM builder, also noting the first key that appears twice in one object.
// A SAX handler rather than a parser callback: with a callback, nlohmann scans the enclosing
// object or array for a discarded value after every object it closes, which made parsing
// quadratic in the number of sibling objects (a safetensors header of 30,000 tensors took more
// than a minute to parse).
// Nesting is bounded: every later step that walks a value (nlohmann's dump, our decoders,
// Python's json module) recurses once per level, and a file nested 200,000 levels deep would
// overflow the stack there.
inline constexpr size_t kMaxJsonDepth = 256;

template <typename JsonT>
class StrictDomParser : public nlohmann::detail::json_sax_dom_parser<JsonT> {
  using Base = nlohmann::detail::json_sax_dom_parser<JsonT>;

 public:
  StrictDomParser(JsonT& result, size_t max_depth)
      : Base(result, /*allow_exceptions_=*/true), max_depth_(max_depth) {}

  bool start_object(std::size_t elements) {
    if (!enter()) return false;
    open_objects_.emplace_back();
    return Base::start_object(elements);
  }
  bool key(typename JsonT::string_t& name) {
    if (!open_objects_.back().insert(name).second && repeated_.empty()) repeated_ = name;
    return Base::key(name);
  }
  bool end_object() {
    --depth_;
    open_objects_.pop_back();
    return Base::end_object();
  }
  bool start_array(std::size_t elements) {
    if (!enter()) return false;
    return Base::start_array(elements);
  }
  bool end_array() {
    --depth_;
    return Base::end_array();
  }
  const std::string& repeated() const { return repeated_; }
  bool too_deep() const { return too_deep_; }

 private:
  // false (which stops the parse) past max_depth_ levels.
  bool enter() {
    if (++depth_ > max_depth_) too_deep_ = true;
    return !too_deep_;
  }

  std::vector<std::unordered_set<std::string>> open_objects_;
  std::string repeated_;
  size_t max_depth_;
  size_t depth_ = 0;
  bool too_deep_ = false;
};

// Parses `text` as JSON, in time linear in its size. nullopt, with the reason in `why`, on a
// syntax error (including bad UTF-8), nesting deeper than `max_depth` levels, or a key that
// appears twice in one object: nlohmann
// silently keeps the last of a repeated key, so two readers of one damaged file could disagree
// on what it holds. JsonT is nlohmann::json (keys sorted, fast for big objects) or
// nlohmann::ordered_json.
template <typename JsonT>
std::optional<JsonT> parse_json_strict(std::string_view text, std::string* why,
                                       size_t max_depth = kMaxJsonDepth) {
  // Exceptions stay inside this function; nlohmann's parse_error message says where it failed.
  try {
    JsonT value;
    StrictDomParser<JsonT> handler(value, max_depth);
    const bool parsed = JsonT::sax_parse(text.begin(), text.end(), &handler);
    if (handler.too_deep()) {
      *why = "nested deeper than " + std::to_string(max_depth) + " levels";
      return std::nullopt;
    }
    if (!parsed) {
      *why = "not valid JSON";
      return std::nullopt;
    }
    if (!handler.repeated().empty()) {
      *why = "key \"" + printable(handler.repeated()) + "\" appears twice in one object";
      return std::nullopt;
    }
    return value;
  } catch (const nlohmann::json::exception& e) {
    *why = "not valid JSON: " + printable(e.what());
    return std::nullopt;
  }
}

// product(shape) * element_bytes, or nullopt when it does not fit in 64 bits. The element count
// is formed first, as the reference safetensors reader does, so both agree on what overflows.
inline std::optional<uint64_t> tensor_nbytes(const std::vector<uint64_t>& shape,
                                             uint64_t element_bytes) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  uint64_t elements = 1;
  for (uint64_t dim : shape) {
    if (dim != 0 && elements > kMax / dim) return std::nullopt;
    elements *= dim;
  }
  if (element_bytes != 0 && elements > kMax / element_bytes) return std::nullopt;
  return elements * element_bytes;
}

// Reads exactly `length` bytes at `offset`, retrying interrupted and short reads. A file that
// ends early is kDataLoss (it was truncated, possibly while being read).
inline Status pread_exact(int fd, char* out, uint64_t length, uint64_t offset,
                          const std::string& path) {
  uint64_t done = 0;
  while (done < length) {
    ssize_t n = ::pread(fd, out + done, static_cast<size_t>(length - done),
                        static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::from_errno(errno, "read failed").with_path(path).with_range(offset, length);
    }
    if (n == 0) {
      return Status(StatusCode::kDataLoss, "file ended after " + std::to_string(offset + done) +
                                               " bytes, before the bytes it should hold")
          .with_path(path)
          .with_range(offset, length);
    }
    done += static_cast<uint64_t>(n);
  }
  return Status::ok();
}

}  // namespace fastpersist::format_internal
