// SPDX-License-Identifier: Apache-2.0
#include "checkpoint_paths.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>

#include "fastpersist/layout.h"
#include "fastpersist/manifest.h"
#include "fastpersist/safetensors.h"

namespace fastpersist::cli {
namespace {

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// A directory that holds what only a checkpoint holds: its data files or its sidecar.
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
  const std::string manifest(kManifestFileName);
  if (S_ISDIR(st.st_mode)) {
    std::string m = (std::filesystem::path(path) / manifest).string();
    info.kind = exists(m) || has_checkpoint_files(path) ? PathKind::kCheckpoint : PathKind::kRoot;
    return info;
  }
  if (!S_ISREG(st.st_mode)) {
    info.kind = PathKind::kOtherFile;
    return info;
  }
  std::filesystem::path p(path);
  if (p.filename() == manifest) {
    info.kind = PathKind::kCheckpoint;
    info.path = p.has_parent_path() ? p.parent_path().string() : ".";
    return info;
  }
  if (ends_with(path, std::string(kDataFileSuffix)) || read_safetensors_header(path).is_ok()) {
    info.kind = PathKind::kSafetensors;
    return info;
  }
  info.kind = PathKind::kOtherFile;
  return info;
}

int fail(const std::string& command, const std::string& message, int code) {
  std::cout.flush();
  std::cerr << "fastpersist " << command << ": error: " << message << "\n";
  return code;
}

std::string iso_time_utc(double unix_seconds) {
  // A damaged manifest may hold any number; casting one beyond time_t's range is undefined.
  if (!(unix_seconds > -1e15 && unix_seconds < 1e15)) return "?";
  std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  if (::gmtime_r(&t, &tm) == nullptr) return "?";
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

std::string shape_string(const std::vector<uint64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

std::vector<SkippedDir> split_skipped(const std::vector<std::string>& skipped) {
  std::vector<SkippedDir> out;
  for (const std::string& s : skipped) {
    size_t colon = s.find(": ");
    if (colon == std::string::npos) {
      out.push_back({s, ""});
    } else {
      out.push_back({s.substr(0, colon), s.substr(colon + 2)});
    }
  }
  return out;
}

std::string pad(const std::string& text, size_t width) {
  return text.size() >= width ? text : text + std::string(width - text.size(), ' ');
}

}  // namespace fastpersist::cli
