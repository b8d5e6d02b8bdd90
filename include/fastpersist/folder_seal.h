// SPDX-License-Identifier: Apache-2.0
// A folder of files written by someone else's writers (a framework's checkpoint-N/: its
// safetensors, optimizer.pt, trainer_state.json, ...), sealed so that it can be trusted later.
//
// seal_folder() fdatasyncs every regular file directly in the folder, records each one's size
// and XXH3-64, writes that list as the marker file (durable, written last, through a temporary
// and a rename), and fsyncs the folder. check_sealed_folder() says whether a folder carries a
// marker and whether every file it lists is still there with its size (and, with `checksums`,
// its bytes). A framework's resume then skips a folder that was never sealed (a save cut short)
// or that changed since.
//
// The marker is JSON: {"format": "fastpersist-sealed-folder", "version": 1,
// "files": [{"name", "size", "checksum" (16 hex digits)}...]}. Files that appear after the seal
// are not covered; subfolders are refused (kInvalidArgument) rather than left unsealed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fastpersist/status.h"

namespace fastpersist {

inline constexpr const char* kFolderSealName = "fastpersist-sealed.json";

struct SealedFile {
  std::string name;
  uint64_t size = 0;
  uint64_t checksum = 0;  // XXH3-64 of the whole file
};

// Seals `dir` (see above) and returns what the marker lists. An existing marker is replaced.
// `known`: files the caller wrote itself, durably, and hashed while writing (a DeferredFileWriter's
// records): they are neither read nor synced again, only their sizes checked (kDataLoss when a
// file's size differs from its record, kNotFound when it is not in the folder).
Result<std::vector<SealedFile>> seal_folder(const std::string& dir, bool durable,
                                            const std::vector<SealedFile>& known = {});

enum class SealState {
  kUnsealed,  // no marker: never sealed (a save cut short, or another writer's folder)
  kSealed,    // every listed file is there, with its size (and checksum when checked)
  kDamaged,   // a marker, but a file is missing or differs, or the marker does not parse
};

struct SealCheck {
  SealState state = SealState::kUnsealed;
  std::string problem;  // kDamaged: what differs, naming the file
};

// Checks `dir` against its marker; an error only when `dir` cannot be read at all.
Result<SealCheck> check_sealed_folder(const std::string& dir, bool checksums);

}  // namespace fastpersist
