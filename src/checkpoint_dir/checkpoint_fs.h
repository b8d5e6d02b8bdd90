// SPDX-License-Identifier: Apache-2.0
// File-system steps of the checkpoint commit protocol and of retention, and the files a manifest
// names (private to src/checkpoint_dir and the layers above: load, checkpoint). Every function
// reports errno, the operation and the path.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "fastpersist/manifest.h"
#include "fastpersist/status.h"

namespace fastpersist::checkpoint {

std::string join_path(const std::string& dir, std::string_view name);

// fsync of a directory, so that entries created or renamed in it are durable.
Status fsync_dir(const std::string& dir);
// Creates (O_EXCL) and writes `path` with `bytes`, then fdatasyncs it when `durable`.
Status write_new_file(const std::string& path, std::string_view bytes, bool durable);
// The whole content of a small file inside a checkpoint root: a regular file, not a symbolic
// link, FIFO or device (kDataLoss; open_regular_file), of at most `max_bytes`.
Result<std::string> read_small_file(const std::string& path, size_t max_bytes = 64 << 20);
// Replaces `path` atomically: <dir>/.<name>.tmp-<pid> written + fsynced, renamed, dir fsynced.
Status replace_file_atomically(const std::string& path, std::string_view bytes, bool durable);
// rename() that fails with kAlreadyExists instead of replacing an existing target.
Status rename_no_replace(const std::string& from, const std::string& to);
// rm -rf; a missing path is fine.
Status remove_tree(const std::string& path);
// Names in `dir` (not "." or ".."), unsorted.
Result<std::vector<std::string>> list_dir(const std::string& dir);
// Size of a regular file inside a checkpoint root (kNotFound when absent, kDataLoss when it is
// a symbolic link or not a regular file).
Result<uint64_t> file_size(const std::string& path);
// Every file `manifest` names exists with its recorded size (kDataLoss names the first that
// does not), references into other checkpoints included: the cheap check behind listing and
// opening a checkpoint. Linear in the number of files. (manifest_files.cc)
Status check_manifest_files(const std::string& dir, const Manifest& manifest);
// The path of `file` of the checkpoint in `dir` (manifest_file_path), after the checks that a
// reference "<tag>/<name>" needs: <root>/<tag> is a directory, not a symbolic link, holding a
// manifest.json, and <root>/<tag>/<name> is not a symbolic link, so that a reference never
// leads out of the root. kDataLoss says what is wrong; whether the file exists and has its
// size is the caller's check. (manifest_files.cc)
Result<std::string> resolve_manifest_file(const std::string& dir, const ManifestFile& file);
// Every tensor record of `manifest` (the checkpoint that will be `dir`) that points into another
// checkpoint of the root (a file reference, or an XOR delta's base) is a record that checkpoint's
// own manifest holds: the same file and offset, stored length, encoding and checksum. A save
// copies those records from its base, so a disagreement is a forged or damaged manifest, refused
// (kDataLoss) before a pull or a tier copy commits it: the bytes referenced are not read again.
// (manifest_files.cc)
Status check_references_against_bases(const std::string& dir, const Manifest& manifest);
// A short string unique within this machine for temporary names: "<pid>-<counter>-<random>".
std::string unique_suffix();

}  // namespace fastpersist::checkpoint
