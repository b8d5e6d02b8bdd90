// SPDX-License-Identifier: Apache-2.0
// Which names may be checkpoint tags: they become directory names under the root, so they must
// be portable, never hidden (hidden names are the manager's own: .tmp-*, .trash-*, .lock) and
// never the `latest` pointer.
#include <string>

#include "fastpersist/checkpoint.h"
#include "fastpersist/layout.h"

namespace fastpersist {

Status validate_tag(const std::string& tag) {
  constexpr size_t kMaxTagLength = 200;
  if (tag.empty()) return {StatusCode::kInvalidArgument, "checkpoint tag is empty"};
  if (tag.size() > kMaxTagLength) {
    return {StatusCode::kInvalidArgument,
            "checkpoint tag is longer than " + std::to_string(kMaxTagLength) + " characters"};
  }
  if (tag[0] == '.') {
    return {StatusCode::kInvalidArgument,
            "checkpoint tag '" + tag + "' starts with '.' (reserved for temporary directories)"};
  }
  if (tag == kLatestFileName) {
    return {StatusCode::kInvalidArgument, "checkpoint tag '" + tag +
                                              "' is reserved for the pointer to the newest checkpoint"};
  }
  for (char c : tag) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) {
      return {StatusCode::kInvalidArgument,
              "checkpoint tag '" + tag + "' has a character outside [A-Za-z0-9._-]"};
    }
  }
  return Status::ok();
}

}  // namespace fastpersist
