// SPDX-License-Identifier: Apache-2.0
// Which names may be checkpoint tags: they become directory names under the root, so they must
// be portable, never hidden (hidden names are the manager's own: .tmp-*, .trash-*, .lock) and
// never the `latest` pointer. The rule lives in the format layer (check_tag_syntax), because a
// v2 manifest's references into other checkpoints name them by tag too.
#include <string>

#include "fastpersist/checkpoint.h"
#include "fastpersist/manifest.h"

namespace fastpersist {

Status validate_tag(const std::string& tag) { return check_tag_syntax(tag); }

}  // namespace fastpersist
