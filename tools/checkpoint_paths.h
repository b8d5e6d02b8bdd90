// SPDX-License-Identifier: Apache-2.0
// What the checkpoint subcommands (list, inspect, verify, prune) share: the library's path
// classifier (src/checkpoint/path_kind.h), the messages for a path of the wrong kind, and the small
// formatting helpers of their output.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/path_kind.h"

namespace fastpersist::cli {

// "<path> is <what it is>, not <wanted>": the message for a path of the wrong kind, with the
// classifier's description of what it is.
std::string wrong_kind(const PathInfo& info, const std::string& wanted);

// "fastpersist <command>: error: <message>" on stderr; returns `code`.
int fail(const std::string& command, const std::string& message, int code);

// Seconds since the epoch as ISO 8601 UTC, to the second: "2024-05-01T12:00:00Z"; "?" when no
// date can be made of them.
std::string iso_time_utc(double unix_seconds);
// "[2, 3]", "[]" for a scalar.
std::string shape_string(const std::vector<uint64_t>& shape);

// list_checkpoints' "tag: reason" entries, split.
struct SkippedDir {
  std::string tag;
  std::string reason;
};
std::vector<SkippedDir> split_skipped(const std::vector<std::string>& skipped);

// Pads or leaves `text` to `width` columns (left aligned).
std::string pad(const std::string& text, size_t width);

}  // namespace fastpersist::cli

namespace fastpersist::cli {

// The body of `fastpersist list ROOT` (also what `inspect ROOT` prints). `command` names the
// subcommand in error messages. Returns an exit code.
// With `tiers` (the roots a manager drains into, docs/tiers.md): where each checkpoint also
// lives, and the checkpoints only a tier holds.
int print_root_listing(const std::string& command, const std::string& root, bool json,
                       const std::vector<std::string>& tiers = {});

}  // namespace fastpersist::cli
