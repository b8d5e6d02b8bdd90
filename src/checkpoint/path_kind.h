// SPDX-License-Identifier: Apache-2.0
// What a path given by a user is (private to the library, its CLI and its Python package: not
// installed): a checkpoint directory, a root of checkpoints, a safetensors
// file, a torch file, ... The one classifier of fastpersist: the CLI (list, inspect, verify,
// prune, clean) and the Python package (`fastpersist convert`, through `_core.classify_path`)
// both ask it, so they give one answer for one path.
//
// Rules, in order:
//  - a path that cannot be stat'ed is kMissing (`error` says why);
//  - a directory with manifest.json is kCheckpoint; a directory with a checkpoint's data files
//    (tensors-*.safetensors) or its objects.pkl but no manifest.json is kIncompleteCheckpoint:
//    not a committed checkpoint (a save that never committed, a damaged one, or files another
//    tool wrote), never loaded and never treated as a root; any other directory is kRoot;
//  - a regular file named manifest.json is kCheckpoint, with `path` its directory;
//  - a regular file named *.safetensors, or starting with a valid safetensors header, is
//    kSafetensors; one named *.pt, *.pth, *.bin or *.ckpt, or starting like a file torch.save
//    writes (a zip archive, or a legacy pickle with torch's magic number), is kTorchFile;
//  - anything else (other files, devices, sockets) is kOtherFile.
//
// Thread-safety: classify_path reads the file system only; it may run on any thread.
#pragma once

#include <string>
#include <string_view>

namespace fastpersist {

// Values are stable: bound to Python by name.
enum class PathKind {
  kMissing,
  kCheckpoint,
  kIncompleteCheckpoint,
  kRoot,
  kSafetensors,
  kTorchFile,
  kOtherFile,
};

struct PathInfo {
  PathKind kind = PathKind::kMissing;
  std::string path;   // as given, except the checkpoint directory for a manifest.json
  std::string error;  // kMissing: why ("... does not exist", "cannot examine ...: <errno>")
};

PathInfo classify_path(const std::string& path);

// A short machine name: "missing", "checkpoint", "incomplete_checkpoint", "root",
// "safetensors", "torch", "other" (the CLI's JSON and Python's `PathInfo.name`).
std::string_view path_kind_name(PathKind kind);

// What the kind is, for messages: "a checkpoint directory", "an incomplete or foreign checkpoint
// directory (data files but no manifest.json: not a committed checkpoint)", ...
std::string_view describe_path_kind(PathKind kind);

}  // namespace fastpersist
