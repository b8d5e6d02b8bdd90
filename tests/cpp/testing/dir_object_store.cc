// SPDX-License-Identifier: Apache-2.0
#include "testing/dir_object_store.h"

#include <filesystem>
#include <fstream>
#include <new>
#include <sstream>
#include <thread>
#include <utility>

namespace fastpersist::testing {
namespace fs = std::filesystem;

namespace {
constexpr const char* kObjects = "objects";
constexpr const char* kUploads = "uploads";
}  // namespace

DirObjectStore::DirObjectStore(std::string dir, std::string url)
    : dir_(std::move(dir)), url_(std::move(url)) {
  fs::create_directories(fs::path(dir_) / kObjects);
  fs::create_directories(fs::path(dir_) / kUploads);
}

std::string DirObjectStore::path_of(const std::string& key) const {
  return (fs::path(dir_) / kObjects / key).string();
}

Status DirObjectStore::check(const std::string& key) const {
  if (unreachable)
    return Status(StatusCode::kIoError, "connection refused (test store unreachable)", 111);
  if (!fail_key.empty() && key.find(fail_key) != std::string::npos) {
    return Status(StatusCode::kIoError, "injected failure on " + key, 5);
  }
  return ObjectStore::check_key(key);
}

Result<std::vector<ObjectEntry>> DirObjectStore::list(const std::string& prefix) {
  if (out_of_memory) throw std::bad_alloc();
  if (unreachable)
    return Status(StatusCode::kIoError, "connection refused (test store unreachable)", 111);
  std::vector<ObjectEntry> out;
  const fs::path root = fs::path(dir_) / kObjects;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file()) continue;
    std::string key = fs::relative(e.path(), root).string();
    if (key.compare(0, prefix.size(), prefix) != 0) continue;
    uint64_t size = static_cast<uint64_t>(e.file_size());
    if (key.size() >= 13 && key.compare(key.size() - 13, 13, "manifest.json") == 0)
      size += manifest_size_lie;
    out.push_back({key, size});
  }
  return out;
}

Status DirObjectStore::get(const std::string& key, uint64_t offset, std::span<std::byte> into) {
  FP_RETURN_IF_ERROR(check(key));
  for (uint64_t seen = largest_get.load();
       into.size() > seen && !largest_get.compare_exchange_weak(seen, into.size());) {
  }
  std::ifstream in(path_of(key), std::ios::binary);
  if (!in) return Status(StatusCode::kNotFound, "no such key: " + key);
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(reinterpret_cast<char*>(into.data()), static_cast<std::streamsize>(into.size()));
  if (static_cast<size_t>(in.gcount()) != into.size()) {
    return Status(StatusCode::kDataLoss, "the object " + key + " ends before the range read");
  }
  return Status::ok();
}

Status DirObjectStore::put(const std::string& key, std::span<const std::byte> data) {
  FP_RETURN_IF_ERROR(check(key));
  ++puts;
  write(key, std::string(reinterpret_cast<const char*>(data.data()), data.size()));
  return Status::ok();
}

Result<std::string> DirObjectStore::begin_upload(const std::string& key) {
  FP_RETURN_IF_ERROR(check(key));
  std::lock_guard lock(mu_);
  std::string id = "u" + std::to_string(next_upload_++);
  uploads_[id] = key;
  fs::create_directories(fs::path(dir_) / kUploads / id);
  return id;
}

Result<std::string> DirObjectStore::upload_part(const std::string& key,
                                                const std::string& upload_id, int part_number,
                                                std::span<const std::byte> data) {
  FP_RETURN_IF_ERROR(check(key));
  int now = ++parts_in_flight;
  int seen = most_parts_in_flight.load();
  while (now > seen && !most_parts_in_flight.compare_exchange_weak(seen, now)) {
  }
  if (part_delay.count() > 0) std::this_thread::sleep_for(part_delay);
  {
    std::lock_guard lock(mu_);
    auto it = uploads_.find(upload_id);
    if (it == uploads_.end() || it->second != key) {
      --parts_in_flight;
      return Status(StatusCode::kNotFound, "no such upload: " + upload_id);
    }
  }
  std::ofstream out(fs::path(dir_) / kUploads / upload_id / std::to_string(part_number),
                    std::ios::binary);
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  --parts_in_flight;
  ++parts_uploaded;
  return "etag-" + std::to_string(part_number);
}

Status DirObjectStore::complete_upload(const std::string& key, const std::string& upload_id,
                                       const std::vector<std::string>& etags) {
  FP_RETURN_IF_ERROR(check(key));
  std::string joined;
  for (size_t i = 0; i < etags.size(); ++i) {
    if (etags[i] != "etag-" + std::to_string(i + 1)) {
      return Status(StatusCode::kInvalidArgument,
                    "part " + std::to_string(i + 1) + " has ETag '" + etags[i] + "'");
    }
    std::ifstream in(fs::path(dir_) / kUploads / upload_id / std::to_string(i + 1),
                     std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    joined += ss.str();
  }
  {
    std::lock_guard lock(mu_);
    uploads_.erase(upload_id);
  }
  fs::remove_all(fs::path(dir_) / kUploads / upload_id);
  write(key, joined);
  return Status::ok();
}

Status DirObjectStore::abort_upload(const std::string& key, const std::string& upload_id) {
  FP_RETURN_IF_ERROR(check(key));
  std::lock_guard lock(mu_);
  uploads_.erase(upload_id);
  fs::remove_all(fs::path(dir_) / kUploads / upload_id);
  return Status::ok();
}

Result<uint64_t> DirObjectStore::abort_uploads(const std::string& prefix) {
  if (unreachable)
    return Status(StatusCode::kIoError, "connection refused (test store unreachable)", 111);
  std::lock_guard lock(mu_);
  uint64_t n = 0;
  for (auto it = uploads_.begin(); it != uploads_.end();) {
    if (it->second.compare(0, prefix.size(), prefix) == 0) {
      fs::remove_all(fs::path(dir_) / kUploads / it->first);
      it = uploads_.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

Status DirObjectStore::remove(const std::vector<std::string>& keys) {
  if (unreachable)
    return Status(StatusCode::kIoError, "connection refused (test store unreachable)", 111);
  for (const std::string& k : keys) {
    FP_RETURN_IF_ERROR(ObjectStore::check_key(k));
    std::error_code ec;
    fs::remove(path_of(k), ec);
  }
  return Status::ok();
}

std::vector<std::string> DirObjectStore::open_uploads() {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (const auto& [id, key] : uploads_) out.push_back(key + " " + id);
  return out;
}

std::string DirObjectStore::read(const std::string& key) const {
  std::ifstream in(path_of(key), std::ios::binary);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void DirObjectStore::write(const std::string& key, const std::string& bytes) {
  fs::path p = path_of(key);
  fs::create_directories(p.parent_path());
  fs::path tmp = p;
  tmp += ".part-write";
  {
    std::ofstream out(tmp, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  fs::rename(tmp, p);
}

}  // namespace fastpersist::testing
