// SPDX-License-Identifier: Apache-2.0
// The name rules of a manifest (private to src/format/): plain file names, file references and
// encoding names. The tag rule itself is public (check_tag_syntax in manifest.h) because the
// manager validates the tags it is given by the same rule.
#pragma once

#include <string>
#include <string_view>

namespace fastpersist::format_internal {

// Why `name` is not a plain file name of a checkpoint directory ("" when it is one): empty,
// ".", "..", or holding '/' or a NUL byte.
std::string plain_file_name_problem(std::string_view name);

// Why `name`, a files entry's name, is neither a plain file name nor a reference
// "<tag>/<plain name>" into another checkpoint of the root than `own_tag` ("" when it is one).
std::string file_name_problem(std::string_view name, std::string_view own_tag);

// [a-z0-9_-]{1,64}: what an encoding name may look like, known to this build or not.
bool is_encoding_name(std::string_view name);

}  // namespace fastpersist::format_internal
