// SPDX-License-Identifier: Apache-2.0
#include "checkpoint/path_kind.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/regular_file.h"
#include "common/unique_fd.h"
#include "fastpersist/layout.h"
#include "fastpersist/manifest.h"
#include "fastpersist/safetensors.h"

namespace fastpersist {
namespace {

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

// What only a checkpoint directory holds: its data files or its sidecar of objects.
bool has_checkpoint_files(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    if (name == kObjectsFileName || is_data_file_name(name)) {
      return true;
    }
  }
  return false;
}

bool has_torch_suffix(std::string_view path) {
  for (std::string_view suffix : {".pt", ".pth", ".bin", ".ckpt"}) {
    if (ends_with(path, suffix)) return true;
  }
  return false;
}

// torch.save writes a zip archive (local file header "PK\3\4"), or with
// _use_new_zipfile_serialization=False a pickle (protocol 2) whose first object is torch's
// magic number 0x1950a86a20f9469cfc6c as a LONG1 of 10 bytes.
bool starts_like_torch_save(const std::string& path) {
  Result<RegularFile> file = open_regular_file(path, Symlinks::kFollow);  // never blocks
  if (!file.is_ok()) return false;
  std::array<unsigned char, 4> head{};
  if (::pread(file->fd.get(), head.data(), head.size(), 0) != static_cast<ssize_t>(head.size())) {
    return false;
  }
  static constexpr std::array<unsigned char, 4> kZip = {'P', 'K', 3, 4};
  static constexpr std::array<unsigned char, 4> kLegacyPickle = {0x80, 0x02, 0x8a, 0x0a};
  return head == kZip || head == kLegacyPickle;
}

}  // namespace

PathInfo classify_path(const std::string& path) {
  PathInfo info;
  info.path = path;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    int err = errno;
    info.error = err == ENOENT ? path + " does not exist"
                               : "cannot examine " + path + ": " + std::strerror(err);
    return info;
  }
  if (S_ISDIR(st.st_mode)) {
    struct stat manifest {};
    std::string m = (std::filesystem::path(path) / kManifestFileName).string();
    if (::stat(m.c_str(), &manifest) == 0) {
      info.kind = PathKind::kCheckpoint;
    } else if (has_checkpoint_files(path)) {
      info.kind = PathKind::kIncompleteCheckpoint;
    } else {
      info.kind = PathKind::kRoot;
    }
    return info;
  }
  if (!S_ISREG(st.st_mode)) {
    info.kind = PathKind::kOtherFile;
    return info;
  }
  std::filesystem::path p(path);
  if (p.filename() == kManifestFileName) {
    info.kind = PathKind::kCheckpoint;
    info.path = p.has_parent_path() ? p.parent_path().string() : ".";
    return info;
  }
  if (ends_with(path, ".safetensors") || read_safetensors_header(path).is_ok()) {
    info.kind = PathKind::kSafetensors;
  } else if (has_torch_suffix(path) || starts_like_torch_save(path)) {
    info.kind = PathKind::kTorchFile;
  } else {
    info.kind = PathKind::kOtherFile;
  }
  return info;
}

std::string_view path_kind_name(PathKind kind) {
  switch (kind) {
    case PathKind::kMissing:
      return "missing";
    case PathKind::kCheckpoint:
      return "checkpoint";
    case PathKind::kIncompleteCheckpoint:
      return "incomplete_checkpoint";
    case PathKind::kRoot:
      return "root";
    case PathKind::kSafetensors:
      return "safetensors";
    case PathKind::kTorchFile:
      return "torch";
    case PathKind::kOtherFile:
      return "other";
  }
  return "other";
}

std::string_view describe_path_kind(PathKind kind) {
  switch (kind) {
    case PathKind::kMissing:
      return "a path that does not exist";
    case PathKind::kCheckpoint:
      return "a checkpoint directory";
    case PathKind::kIncompleteCheckpoint:
      return "an incomplete or foreign checkpoint directory (data files but no manifest.json: "
             "not a committed checkpoint)";
    case PathKind::kRoot:
      return "a checkpoint root";
    case PathKind::kSafetensors:
      return "a safetensors file";
    case PathKind::kTorchFile:
      return "a torch file";
    case PathKind::kOtherFile:
      return "a file of unknown type";
  }
  return "a file of unknown type";
}

}  // namespace fastpersist
